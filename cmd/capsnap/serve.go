package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
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
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/checkcodec"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/envoy"
	"github.com/capsnap/capsnap/extauthz"
	"github.com/capsnap/capsnap/extproc"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/tracing"
)

// healthServices are the grpc.health.v1 names capsnap answers for: the
// server as a whole, and each service Envoy calls.
var healthServices = []string{"", authv3.Authorization_ServiceDesc.ServiceName, extprocv3.ExternalProcessor_ServiceDesc.ServiceName}

// shutdownGrace bounds how long in-flight Checks may take to finish.
const shutdownGrace = 10 * time.Second

// check validates the configuration at path, and everything it names,
// the way serve loads them; and the Envoy bootstrap at envoyPath, if any
// (checkEnvoy).
func check(path, envoyPath string, connect bool, timeout time.Duration, stdout, stderr io.Writer) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	rules, err := decide.LoadRules(cfg.PolicyFile)
	if err != nil {
		return err
	}
	if err := approvalsFor(cfg, rules.Policy); err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if _, err := sources(cfg, zerolog.Nop(), nil); err != nil {
		return err
	}
	if cfg.Snapshots.Store == config.StoreRedis {
		if _, err := redisOptions(cfg.Snapshots.Redis); err != nil {
			return err
		}
	}
	if _, err := envelopeKeys(cfg); err != nil {
		return err
	}
	if _, err := grantKeys(cfg); err != nil {
		return err
	}
	if _, err := newHop(cfg, zerolog.Nop()); err != nil {
		return err
	}
	envoyNote, err := checkEnvoy(cfg, envoyPath, stderr)
	if err != nil {
		return err
	}
	problems, toolsNote, err := checkTools(cfg, rules.Policy, connect, timeout)
	if err != nil {
		return err
	}
	for _, p := range problems {
		fmt.Fprintf(stderr, "error: %s: %s\n", path, p)
	}
	if len(problems) > 0 {
		return fmt.Errorf("check: %s: %s", path, countOf(len(problems), "error"))
	}
	fmt.Fprintf(stdout, "%s: ok (%d servers, policy %s%s%s)\n", path, len(cfg.Servers), rules.Policy.Digest(), toolsNote, envoyNote)
	return nil
}

// checkTools holds the policy to the servers' tools: the catalog files',
// and with connect every server's live list, fetched as serve would. Each
// constraint or budget amount that reads an argument a tool's inputSchema
// does not declare is a problem (it would deny every call at run time),
// and with connect so is each live tool the policy does not classify
// (every call to it is denied unclassified_tool).
func checkTools(cfg config.Config, p *policy.Policy, connect bool, timeout time.Duration) (problems []string, note string, err error) {
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

// checkEnvoy checks that the Envoy bootstrap at path, if any, sends the
// response of every tools/list capsnap allows back to capsnap, when the
// configuration binds snapshots to what is delivered. Each way it does
// not is a warning, on stderr: Envoy's configuration may well be built
// elsewhere (xDS, Istio) and only its shape is known here.
func checkEnvoy(cfg config.Config, path string, stderr io.Writer) (string, error) {
	if path == "" {
		return "", nil
	}
	if cfg.Discovery.Bind != config.BindDelivered {
		return fmt.Sprintf(", %s not checked: discovery.bind %s has no response path", path, cfg.Discovery.Bind), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--envoy: %w", err)
	}
	warn, err := envoy.CheckResponsePath(data)
	if err != nil {
		return "", fmt.Errorf("--envoy %s: %w", path, err)
	}
	for _, w := range warn {
		fmt.Fprintf(stderr, "warning: %s: %s; capsnap never sees those tools/list responses, so agents get the server's list unfiltered and every tools/call is denied no_snapshot\n", path, w)
	}
	return fmt.Sprintf(", %s: %d response path warnings", path, len(warn)), nil
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
	log := newLogger(cfg.Log, stderr)
	keys, err := envelopeKeys(cfg)
	if err != nil {
		return err
	}
	grants, err := grantKeys(cfg)
	if err != nil {
		return err
	}
	// The audit trail (audit.go): group commit, chained, its checkpoints
	// signed with the envelope keys; closed last, after every decision.
	auditLog, closeAudit, err := openAudit(cfg.Audit, stdout, keys, log)
	if err != nil {
		return err
	}
	defer closeAudit()

	rules, err := decide.LoadRules(cfg.PolicyFile)
	if err != nil {
		return err
	}
	hop, err := newHop(cfg, log)
	if err != nil {
		return err
	}
	if observed := cfg.Observed(); len(observed) > 0 {
		log.Warn().Strs("servers", observed).
			Msg("OBSERVE MODE: capsnap decides, audits and counts every request to these servers and enforces nothing: a request it would deny passes, and a tools/list response reaches the agent unfiltered")
	}
	if cfg.Principal.Source == config.SourceHeader {
		log.Warn().Str("header", cfg.Principal.Header).
			Msg("INSECURE: principal taken from a client-supplied header; Envoy must strip it from clients. Development only.")
	}
	// The catalog is built on the sources; its list_changed counts go to it.
	var cat *catalog.Catalog
	srcs, err := sources(cfg, log, func(id string) { cat.NoteListChanged(id) })
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The catalog reports changes to the server built on it below.
	var srv *decide.Server
	cat = catalog.New(srcs, catalog.Options{Logger: log, OnChange: func(id string, prev, next *catalog.List, changed []string) {
		srv.CatalogChanged(id, prev, next, changed)
	}})
	reg.MustRegister(cat)
	store, err := openStore(cfg, log, auditLog, reg)
	if err != nil {
		return err
	}
	defer store.close()
	if err := approvalsFor(cfg, rules.Policy); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	approvals, approvalServer, err := openApprovals(cfg, store, auditLog, log, reg)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if approvals != nil {
		defer approvals.Close()
	}
	srv, err = decide.New(decide.Options{
		Approvals:        approvals,
		Catalog:          cat,
		Servers:          cat.Servers(),
		Rules:            rules,
		Denials:          cfg.Denials,
		Snapshots:        store.Backend,
		ListingKey:       store.listingKey,
		SnapshotTTL:      cfg.Snapshots.TTL,
		Bind:             cfg.Discovery.Bind,
		MaxResponseBytes: cfg.Discovery.MaxResponseBytes,
		Freshness:        cfg.Catalog,
		Principal:        cfg.Principal,
		Limits:           mcpparse.Limits{MaxBodyBytes: cfg.Limits.MaxBodyBytes, MaxDepth: cfg.Limits.MaxDepth},
		Observe:          cfg.Observed(),
		ReleaseOnError:   cfg.ReleasingOnError(),
		Audit:            auditLog,
		Metrics:          decide.NewMetrics(reg),
		Envelope:         keys,
		EnvelopeTTL:      cfg.Envelope.TTL,
		Grants:           grants,
	})
	if err != nil {
		return err
	}

	tracer, stopTracing, err := tracing.New(context.Background(), cfg.Tracing, versionString())
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer func() {
		// Spans still batched go out before exit, within a bound.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := stopTracing(ctx); err != nil {
			log.Warn().Err(err).Msg("tracing: spans not exported at shutdown")
		}
	}()

	grpcLis, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	adminLis, err := net.Listen("tcp", cfg.AdminAddr)
	if err != nil {
		grpcLis.Close()
		return fmt.Errorf("serve: %w", err)
	}
	// A tools/list response reaches ext_proc whole, in one message. A
	// CheckRequest is decoded into only what the decision reads
	// (checkcodec); every other message as gRPC decodes it.
	gs := grpc.NewServer(append(hop.grpcOptions(),
		grpc.MaxRecvMsgSize(max(cfg.Discovery.MaxResponseBytes, cfg.Limits.MaxBodyBytes)+64<<10),
		grpc.ForceServerCodecV2(checkcodec.Codec{}),
		grpc.NumStreamWorkers(streamWorkers))...)
	authv3.RegisterAuthorizationServer(gs, extauthz.New(srv, tracer))
	extprocv3.RegisterExternalProcessorServer(gs, extproc.New(srv, tracer))
	// NOT_SERVING until ready (health.NewServer starts "" SERVING): an
	// Envoy that health-checks its replicas sends a starting one no Check
	// before it can decide them.
	hs := health.NewServer()
	for _, svc := range healthServices {
		hs.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	healthpb.RegisterHealthServer(gs, hs)
	mux := adminMux(cat, reg, srv, cfg.PolicyFile, cfg.Debug.Pprof, log)
	serveJWKS(mux, keys)
	admin := &http.Server{Handler: hop.guardAdmin(mux), ReadHeaderTimeout: 5 * time.Second}

	ctx, stop := signalContext()
	defer stop()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return cat.Run(ctx) })
	g.Go(func() error { hop.run(ctx); return nil })
	g.Go(func() error { return gs.Serve(grpcLis) })
	g.Go(func() error {
		if err := admin.Serve(adminLis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	if approvalServer != nil {
		approvalLis, err := net.Listen("tcp", cfg.Approvals.Addr)
		if err != nil {
			return fmt.Errorf("serve: approvals: %w", err)
		}
		g.Go(func() error { approvals.Run(ctx, 5*time.Second); return nil })
		g.Go(func() error {
			if err := approvalServer.Serve(approvalLis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
			defer cancel()
			return approvalServer.Shutdown(sctx)
		})
		log.Info().Str("addr", cfg.Approvals.Addr).Str("url", approvals.URL("")).Msg("approvals served")
	}
	g.Go(func() error { reloadOnHUP(ctx, cfg.PolicyFile, srv, log); return nil })
	g.Go(func() error { srv.WatchPolicy(ctx, cfg.PolicyFile, cfg.PolicyPoll, log); return nil })
	g.Go(func() error { watchKeys(ctx, keys, cfg.Envelope.KeyPoll, log); return nil }) // envelope.go
	g.Go(func() error { srv.WatchResponsePath(ctx, log); return nil })
	g.Go(func() error {
		<-ctx.Done()
		hs.Shutdown()
		if cfg.Drain > 0 {
			// NOT_SERVING first: Envoy's health check moves new Checks to
			// the other replicas before this one stops taking them.
			log.Info().Int64("drain_ms", cfg.Drain.Milliseconds()).Msg("shutting down: draining")
			time.Sleep(cfg.Drain)
		}
		log.Info().Msg("shutting down: finishing in-flight checks")
		done := make(chan struct{})
		go func() { gs.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(shutdownGrace):
			gs.Stop()
		}
		sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		return admin.Shutdown(sctx)
	})
	g.Go(func() error {
		for srv.Ready() != nil {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(50 * time.Millisecond):
			}
		}
		for _, svc := range healthServices {
			hs.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
		}
		return nil
	})
	log.Info().Str("grpc_addr", cfg.GRPCAddr).Str("admin_addr", cfg.AdminAddr).
		Str("policy_digest", rules.Policy.Digest()).Str("version", versionString()).Msg("capsnap serving")
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
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
	// the admin listener (loopback by default), logged with its result.
	mux.HandleFunc("POST /policy/reload", func(w http.ResponseWriter, r *http.Request) {
		loosen := r.URL.Query().Get("allow_loosening") == "true"
		result, err := srv.Reload(policyFile, loosen)
		ev := log.Info()
		if err != nil {
			ev = log.Error().Err(err)
		}
		ev.Str("trigger", "admin").Bool("allow_loosening", loosen).Str("result", result).Msg("policy reload requested")
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusConflict)
		}
		msg := ""
		if err != nil {
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
			f := &catalog.FileSource{Path: s.CatalogFile}
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
