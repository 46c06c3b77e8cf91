package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/envoy"
	"github.com/capsnap/capsnap/policy"
)

// healthServices are the grpc.health.v1 names capsnap answers for: the
// server as a whole, and each service Envoy calls.
var healthServices = []string{"", authv3.Authorization_ServiceDesc.ServiceName, extprocv3.ExternalProcessor_ServiceDesc.ServiceName}

// shutdownGrace bounds how long in-flight Checks may take to finish.
const shutdownGrace = 10 * time.Second

// check validates the configuration at path, and everything it names,
// with serve's own loader (loadSetup), so that it refuses exactly what
// serve refuses; then holds the pieces to each other: the policy to the
// servers' tools (checkTools) and the Envoy bootstrap at envoyPath, if any,
// to the configuration (checkEnvoy). With connect it asks the network as
// serve would: each server's live list, the shared store, a JWKS URL.
func check(path, envoyPath string, connect bool, timeout time.Duration, stdout, stderr io.Writer) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	set, err := loadSetup(cfg, zerolog.Nop(), connect, nil)
	if err != nil {
		return err
	}
	if connect && set.redis != nil {
		if err := reachStore(cfg, *set.redis, timeout); err != nil {
			return fmt.Errorf("check: %w", err)
		}
	}
	for _, id := range cfg.CallingWithoutListing() {
		fmt.Fprintf(stderr, "warning: %s: server %s has calls_without_listing: a caller that never lists may call its tools, held to the live definition instead of one it was delivered\n", path, id)
	}
	envoyNote, err := checkEnvoy(cfg, envoyPath, stderr)
	if err != nil {
		return err
	}
	problems, toolsNote, err := checkTools(cfg, set.rules.Policy, connect, timeout)
	if err != nil {
		return err
	}
	// Each names a field of the policy, which it is held to the tools by.
	for _, p := range problems {
		fmt.Fprintf(stderr, "error: %s: %s\n", cfg.PolicyFile, p)
	}
	if len(problems) > 0 {
		return fmt.Errorf("check: %s: %s", cfg.PolicyFile, countOf(len(problems), "error"))
	}
	fmt.Fprintf(stdout, "%s: ok (%d servers, policy %s%s%s)\n", path, len(cfg.Servers), set.rules.Policy.Digest(), toolsNote, envoyNote)
	return nil
}

// checkTools holds the policy to the servers' tools: the catalog files',
// and with connect every server's live list, fetched as serve would. Each
// constraint or budget amount that reads an argument a tool's inputSchema
// does not declare is a problem (it would deny every call at run time),
// and with connect so is each live tool the policy does not classify
// (every call to it is denied unclassified_tool); and so is each tool the
// policy classifies that its server does not list (policy.LintServers).
func checkTools(cfg config.Config, p *policy.Policy, connect bool, timeout time.Duration) (problems []string, note string, err error) {
	ids := cfg.ServerIDs()
	if !connect {
		// Without --connect nothing is asked of a server over the network.
		cfg.Servers = slices.DeleteFunc(slices.Clone(cfg.Servers), func(s config.Server) bool { return s.CatalogFile == "" })
	}
	if len(cfg.Servers) == 0 {
		return nil, "", nil
	}
	ctx, stop := signalContext()
	defer stop()
	lists, err := liveLists(ctx, cfg, timeout)
	if err != nil {
		return nil, "", fmt.Errorf("check: %w", err)
	}
	schemas := func(server, tool string) (json.RawMessage, bool) {
		t, ok := lists[server].Tools[tool]
		return t.InputSchema, ok && t.InputSchema != nil
	}
	problems = policy.LintArguments(p, schemas)
	problems = append(problems, policy.LintServers(p, ids, func(server string) ([]string, bool) {
		l, ok := lists[server]
		if !ok {
			return nil, false
		}
		return slices.Sorted(maps.Keys(l.Tools)), true
	})...)
	tools := 0
	for _, id := range slices.Sorted(maps.Keys(lists)) {
		for _, name := range slices.Sorted(maps.Keys(lists[id].Tools)) {
			tools++
			_, err := p.Decide("", id, name)
			if de, ok := deny.As(err); connect && ok && de.Reason == deny.UnclassifiedTool {
				problems = append(problems, fmt.Sprintf("server %s serves tool %q, which the policy does not classify: every call to it is denied unclassified_tool", id, name))
			}
		}
	}
	how := "from catalog files"
	if connect {
		how = "listed live"
	}
	return problems, fmt.Sprintf(", %s %s", countOf(tools, "tool"), how), nil
}

// checkEnvoy holds the Envoy bootstrap at path, if any, to cfg
// (envoy.Check): the routes' server ids, the principal Envoy passes, the
// cluster that reaches capsnap, the body it sends, failing closed and,
// with discovery.bind delivered, the response path. Each finding names its
// field in the bootstrap; an error (the setup cannot work) fails check, a
// warning (what Envoy's configuration may make right where this cannot
// see, such as xDS) does not.
func checkEnvoy(cfg config.Config, path string, stderr io.Writer) (string, error) {
	if path == "" {
		return "", nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--envoy: %w", err)
	}
	findings, err := envoy.Check(data, cfg.Envoy())
	if err != nil {
		return "", fmt.Errorf("--envoy %s: %w", path, err)
	}
	errs := 0
	for _, f := range findings {
		level := "warning"
		if f.Error {
			level, errs = "error", errs+1
		}
		fmt.Fprintf(stderr, "%s: %s: %s\n", level, path, f)
	}
	if errs > 0 {
		return "", fmt.Errorf("check: %s: %s", path, countOf(errs, "error"))
	}
	return fmt.Sprintf(", %s: %s", path, countOf(len(findings), "warning")), nil
}

// streamWorkers is how many long-lived goroutines run the RPCs, each in
// turn. Without them gRPC starts a goroutine an RPC, whose stack then grows
// by copying through the transport's and the decision's frames, every
// time: 10-15% of the CPU of capsnap, and of the floor, under load
// (runtime.newstack in BENCHMARKS.md's live profiles). A worker keeps its
// grown stack. 64 covers the Checks one read from Envoy's connection
// brings at once under the benchmark's heaviest load; past them, gRPC
// starts a goroutine as it would without workers, so no RPC waits for
// another. bench/noop, the floor, runs the same.
const streamWorkers = 64

// serve runs capsnap with the configuration at path until SIGINT or
// SIGTERM: the audit trail on stdout unless audit.path, the log on stderr.
func serve(path string, stdout, stderr io.Writer) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	svc, err := newService(cfg, stdout, stderr)
	if err != nil {
		return err
	}
	defer svc.close()
	ctx, stop := signalContext()
	defer stop()
	return svc.run(ctx)
}

// reloadOnHUP reloads the policy on SIGHUP, never loosening it.
func reloadOnHUP(ctx context.Context, path string, srv *decide.Server, log zerolog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			decide.LogReload(log, "SIGHUP", path, srv)
		}
	}
}

func adminMux(cat *catalog.Catalog, reg *prometheus.Registry, srv *decide.Server, policyFile string, profiling bool, log zerolog.Logger) *http.ServeMux {
	mux := http.NewServeMux()
	if profiling {
		// Registered by hand: net/http/pprof's init only fills
		// http.DefaultServeMux, which capsnap never serves.
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
		log.Warn().Str("path", "/debug/pprof/").Msg("debug.pprof is on: profiles are served on the admin listener")
	}
	// The one way to loosen the policy in force: an explicit request on
	// the admin listener (loopback by default) that says who accepts it
	// and why, logged with its result, and recorded in the store for
	// every replica that shares it (decide.Server.Reload).
	mux.HandleFunc("POST /policy/reload", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		loosen := q.Get("allow_loosening") == "true"
		var accept *decide.Signoff
		if loosen {
			accept = &decide.Signoff{By: q.Get("by"), Reason: q.Get("reason")}
		}
		result, status, err := "bad_request", http.StatusBadRequest, error(nil)
		switch {
		case !loosen && (q.Has("by") || q.Has("reason")):
			err = errors.New("by and reason say who accepts a looser policy, and why: they go with allow_loosening=true")
		case loosen:
			err = accept.Check()
		}
		if err == nil {
			result, err = srv.Reload(policyFile, accept)
			status = http.StatusConflict
			if result == decide.ReloadUnrecorded {
				status = http.StatusServiceUnavailable
			}
		}
		ev := log.Info()
		if err != nil {
			ev = log.Error().Err(err)
		}
		if loosen {
			ev = ev.Str("by", accept.By).Str("reason", accept.Reason)
		}
		ev.Str("trigger", "admin").Bool("allow_loosening", loosen).Str("result", result).Msg("policy reload requested")
		w.Header().Set("Content-Type", "application/json")
		msg := ""
		if err != nil {
			w.WriteHeader(status)
			msg = err.Error()
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"result": result, "error": msg})
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		// Listings whose response never came back through the response
		// path are detail, not unreadiness. The cause is Envoy's
		// configuration, the same for every replica: failing readiness
		// would take every replica out of rotation, and Envoy, failing
		// closed, would then refuse every MCP request to every server,
		// not only the calls to the misrouted one. A replica out of
		// rotation sees no listing, so it could never see the fix either;
		// and no restart, which is what readiness drives, fixes it. The
		// operator hears of it from the warning in the log, this detail
		// and the CapsnapResponsePathMissing alert.
		unbound := srv.Unbound()
		if err := srv.Ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %v\n", err)
		} else {
			fmt.Fprintln(w, "ready")
		}
		for _, u := range unbound {
			fmt.Fprintln(w, "warning:", u)
		}
		for _, id := range srv.Observed() {
			fmt.Fprintf(w, "warning: server %s is in observe mode: its denials are audited and counted, not enforced\n", id)
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /catalog", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(catalogView(cat))
	})
	// What change control holds each live tool's changes to: the approved
	// definition and the rejected ones (capsnap lock --approved).
	mux.HandleFunc("GET /definitions", func(w http.ResponseWriter, _ *http.Request) {
		defs, err := srv.Definitions()
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
			return
		}
		_ = json.NewEncoder(w).Encode(defs)
	})
	return mux
}

// serverView is one server in GET /catalog: what capsnap itself sees, for
// an operator asking "which contract is capsnap holding calls to?".
type serverView struct {
	Synced     bool       `json:"synced"`
	FetchedAt  time.Time  `json:"fetched_at,omitzero"`
	LastError  string     `json:"last_error,omitempty"`
	Generation uint64     `json:"generation"`
	Tools      []toolView `json:"tools"`
}

type toolView struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
}

func catalogView(cat *catalog.Catalog) map[string]serverView {
	out := map[string]serverView{}
	for _, id := range cat.Servers() {
		list, st, _ := cat.Lookup(id)
		v := serverView{Synced: st.Synced, FetchedAt: st.FetchedAt, Tools: []toolView{}}
		if st.LastError != nil {
			v.LastError = st.LastError.Error()
		}
		if list != nil {
			v.Generation = list.Generation
			for _, t := range list.Tools {
				v.Tools = append(v.Tools, toolView{Name: t.Name, Digest: t.Digest})
			}
			slices.SortFunc(v.Tools, func(a, b toolView) int { return strings.Compare(a.Name, b.Name) })
		}
		out[id] = v
	}
	return out
}

func newLogger(c config.Log, w io.Writer) zerolog.Logger {
	if c.Format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	level, err := zerolog.ParseLevel(c.Level)
	if err != nil {
		level = zerolog.InfoLevel
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

// sources builds a catalog source for every configured server; listChanged,
// if set, hears every list_changed. Catalog files are read here too, so
// that a bad one stops the binary at start (and fails check) instead of
// leaving a server unavailable.
func sources(cfg config.Config, log zerolog.Logger, listChanged func(serverID string)) (map[string]catalog.Source, error) {
	out := make(map[string]catalog.Source, len(cfg.Servers))
	for _, s := range cfg.Servers {
		if s.CatalogFile != "" {
			// Reread often enough that the list never ages past max_age.
			f := &catalog.FileSource{Path: s.CatalogFile, Interval: min(catalog.DefaultFileInterval, cfg.Catalog.MaxAge/4)}
			if _, err := f.Load(); err != nil {
				return nil, fmt.Errorf("servers %s: %w", s.ID, err)
			}
			out[s.ID] = f
			continue
		}
		src := &catalog.MCPSource{
			URL: s.URL, ProtocolVersion: s.ProtocolVersion, Resync: s.Resync, Capabilities: s.ClientCapabilities,
			Logger: log.With().Str("server_id", s.ID).Logger(),
		}
		if listChanged != nil {
			id := s.ID
			src.OnListChanged = func() { listChanged(id) }
		}
		out[s.ID] = src
	}
	return out, nil
}
