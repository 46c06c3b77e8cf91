package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/bench/mcpload"
	"github.com/capsnap/capsnap/bench/report"
	"github.com/capsnap/capsnap/testbed"
)

// The load through Envoy: fixed workers, each bounded by count and time.
const (
	envoyWorkers   = 16
	envoyPerWorker = 5000
	envoyWarmup    = time.Second
)

// headerPrincipal is capsnap's principal section behind the demo's Envoy:
// the development header.
const headerPrincipal = "{source: header, insecure_header: true}"

// throughEnvoy posts MCP tools/call refunds through the real Envoy to
// billing, with no ext_authz, with ext_authz to the floor, with ext_authz
// and ext_proc to the floor and with both to capsnap, and on the shared
// store (issue 15) to capsnap on Redis and to two replicas sharing that
// Redis under their own key prefix: an Envoy per mode, identical but for
// the filter and its cluster, each with its own warm sessions. The first
// floor's allow leaves no decision in Envoy's metadata, so its Envoy
// skips the ext_proc filter, as it does without ext_authz; the second's
// (noop -decision) leaves one, as capsnap's does, so that every answer
// crosses ext_proc as capsnap's do. refund, not lookup_order,
// because it is the call the gRPC cases measure and capsnap's most
// expensive allowed path (its schema, two CEL constraints and the
// sequence rule).
//
// The modes take turns (turnOrder), each turn a share of a mode's run: a
// machine that gets busier or quieter during the step weighs on every
// mode alike.
func (h *harness) throughEnvoy(ctx context.Context) error {
	m := &h.results.Method
	m.EnvoyWorkers, m.EnvoyPerWorker, m.EnvoyRun, m.EnvoyWarmup, m.EnvoyCall = envoyWorkers, envoyPerWorker, h.o.envoyRun, envoyWarmup, "refund"

	// Without pins: only capsnap sends them, and billing's handler-start
	// check would refuse every call of the other two modes.
	billing, billingURL, err := h.startBilling(ctx, "billing-envoy", false)
	if err != nil {
		return err
	}
	// The floor, and the floor whose allow leaves a decision (-decision).
	var floors []*capsnapServer
	for _, f := range []struct {
		name string
		args []string
	}{{"noop-envoy", nil}, {"noop-envoy-ext-proc", []string{"-decision"}}} {
		noop, addr, _, err := h.startNoop(f.name, f.args...)
		if err != nil {
			return err
		}
		if _, err := h.dialCheck(ctx, addr, checkRequest(refundBody, ""), noop); err != nil {
			return err
		}
		floors = append(floors, &capsnapServer{server: noop, grpcAddr: addr})
	}
	redis, redisAddr, err := h.startRedis(ctx, "redis-envoy")
	if err != nil {
		return err
	}
	var capsnaps []*capsnapServer
	for i, name := range []string{"capsnap-envoy", "capsnap-envoy-redis", "capsnap-envoy-replica-0", "capsnap-envoy-replica-1"} {
		spec := capsnapSpec{name: name, billingURL: billingURL, principal: headerPrincipal}
		if i > 0 {
			prefix := "two:" // the replicas'
			if i == 1 {
				prefix = "one:"
			}
			if spec.snapshots, err = h.redisSnapshots(redisAddr, prefix); err != nil {
				return err
			}
		}
		c, err := h.startCapsnap(ctx, spec)
		if err != nil {
			return err
		}
		capsnaps = append(capsnaps, c)
	}
	// Each mode's Envoy and the ext_authz servers it asks, round robin,
	// which serve its ext_proc too, and whether that filter runs on its
	// answers; and the processes that serve its calls, by which a call's
	// CPU is split.
	modes := []struct {
		name, envoy string
		authz       []*capsnapServer
		extProc     bool
	}{
		{report.ModeNone, "envoy-none", nil, false}, {report.ModeFloor, "envoy-floor", floors[:1], false},
		{report.ModeFloorExtProc, "envoy-floor-ext-proc", floors[1:], true},
		{report.ModeCapsnap, "envoy-capsnap", capsnaps[:1], true}, {report.ModeRedis, "envoy-redis", capsnaps[1:2], true},
		{report.ModeReplicas, "envoy-replicas", capsnaps[2:], true},
	}
	var names []string
	envoys := make([]*server, len(modes))
	admins := make([]string, len(modes))
	runners := make([]*mcpload.Runner, len(modes))
	tallies := make([]*cpuTally, len(modes))
	for i, mode := range modes {
		names = append(names, mode.name)
		var to []string
		var pids []int
		for _, a := range mode.authz {
			to, pids = append(to, a.grpcAddr), append(pids, a.Pid())
		}
		var edit func([]byte) ([]byte, error)
		if len(to) == 0 {
			edit = func(cfg []byte) ([]byte, error) { return withoutFilter(cfg, extAuthzFilter) }
		}
		var url string
		if envoys[i], url, admins[i], err = h.startEnvoy(ctx, mode.envoy, billingURL, to, edit); err != nil {
			return fmt.Errorf("%s: %w", mode.name, err)
		}
		load := mcpload.Load{
			URL: url, Header: map[string]string{testbed.PrincipalHeader: agent},
			Setup: []byte(lookupBody), Call: []byte(refundBody),
			Workers: envoyWorkers, Warmup: envoyWarmup,
		}
		if runners[i], err = load.Start(ctx); err != nil {
			return fmt.Errorf("%s: %w", mode.name, err)
		}
		h.later(runners[i].Close)
		procs := []process{{"Envoy", []int{envoys[i].Pid()}}, {"billing", []int{billing.Pid()}}}
		if pids != nil {
			procs = append(procs, process{"the authorizer", pids})
		}
		if slices.Contains(report.StoreModes, mode.name) {
			procs = append(procs, process{"Redis", []int{redis.Pid()}})
		}
		tallies[i] = newCPUTally(append(procs, theLoad())...)
	}
	results, err := callsInTurns(ctx, names, envoys, tallies, capsnaps, func(i int) (mcpload.Sample, error) {
		return runners[i].Measure(ctx, h.o.envoyRun/turns, envoyPerWorker/turns)
	})
	if err != nil {
		return err
	}
	for i, mode := range modes {
		// A mode whose answers skipped ext_proc, or one whose answers
		// crossed it by mistake, is not what the report says it is.
		n, err := extProcStreams(ctx, admins[i])
		if err == nil && mode.extProc && n < results[i].Calls {
			err = fmt.Errorf("ext_proc: Envoy started %d streams for %d calls: some answers skipped ext_proc", n, results[i].Calls)
		}
		if err == nil && !mode.extProc && n != 0 {
			err = fmt.Errorf("ext_proc: Envoy started %d streams, where its filter should be skipped", n)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", mode.name, err)
		}
	}
	for i, mode := range names {
		res := results[i]
		h.results.Envoy = append(h.results.Envoy, report.EnvoyRun{Mode: mode, Result: res, CPU: tallies[i].perCall()})
		h.logf("   %-32s %7.0f calls/s  p50 %-9s p99 %s", mode, res.RPS, report.Dur(res.P50), report.Dur(res.P99))
	}
	return nil
}

// extProcStat is the counter of the streams envoy/demo.yaml's ext_proc
// filter opened, under its HTTP connection manager's stat_prefix: one
// per answer it processed.
const extProcStat = "http.mcp.ext_proc.streams_started"

// extProcStreams is how many ext_proc streams the Envoy whose admin
// interface is at adminURL has started.
func extProcStreams(ctx context.Context, adminURL string) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, adminURL+"/stats?filter="+extProcStat, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("envoy stats: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = errors.New(resp.Status)
	}
	if err != nil {
		return 0, fmt.Errorf("envoy stats: %w", err)
	}
	return parseCounter(b, extProcStat)
}

// parseCounter reads counter name from Envoy's /stats text ("name: 12"
// a line).
func parseCounter(stats []byte, name string) (int, error) {
	for line := range strings.Lines(string(stats)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+": "); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("envoy stats: no %s in %q", name, stats)
}

// startEnvoy runs Envoy as name on envoy/demo.yaml in front of billing,
// its ext_authz and ext_proc filters pointed at authz (round robin over
// several; at a closed port if none), the configuration changed by edit
// if it is not nil, and returns it with its route to billing and its
// admin interface.
func (h *harness) startEnvoy(ctx context.Context, name, billingURL string, authz []string, edit func([]byte) ([]byte, error)) (envoy *server, url, adminURL string, err error) {
	var p testbed.Ports
	for _, f := range []*int{&p.Envoy, &p.EnvoyAdmin, &p.Payments, &p.GRPC} {
		n, err := testbed.FreePort()
		if err != nil {
			return nil, "", "", err
		}
		*f = n
	}
	if p.Billing, err = port(strings.TrimPrefix(billingURL, "http://")); err == nil && len(authz) > 0 {
		p.GRPC, err = port(authz[0])
	}
	cfg := testbed.EnvoyConfig(p)
	if err == nil && len(authz) > 1 {
		cfg, err = withEndpoints(cfg, authz)
	}
	if err == nil && edit != nil {
		cfg, err = edit(cfg)
	}
	path := filepath.Join(h.work, name+".yaml")
	if err == nil {
		err = os.WriteFile(path, cfg, 0o600)
	}
	if err != nil {
		return nil, "", "", err
	}
	// Without hot restart there is no shared memory: several Envoys run
	// side by side.
	adminURL = fmt.Sprintf("http://127.0.0.1:%d", p.EnvoyAdmin)
	envoy, err = h.start(name, h.envoy, "-c", path, "--disable-hot-restart", "--concurrency", "1", "-l", "warning")
	if err == nil {
		err = envoy.awaitHTTP(ctx, adminURL+"/ready")
	}
	return envoy, fmt.Sprintf("http://127.0.0.1:%d/billing/mcp", p.Envoy), adminURL, err
}

func port(addr string) (int, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

// The HTTP filters' names in envoy/demo.yaml: ext_authz, and the response
// path's ext_proc.
const (
	extAuthzFilter = "envoy.filters.http.ext_authz"
	extProcFilter  = "capsnap.ext_proc"
)

// withoutFilter is an Envoy configuration without its one HTTP filter
// named name, and otherwise the same; the routes' per-filter settings for
// it stay, unused.
func withoutFilter(cfg []byte, name string) ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(cfg, &doc); err != nil {
		return nil, fmt.Errorf("envoy config: %w", err)
	}
	removed := 0
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if filters, ok := v["http_filters"].([]any); ok {
				v["http_filters"] = slices.DeleteFunc(filters, func(f any) bool {
					named, _ := f.(map[string]any)
					return named["name"] == name
				})
				removed += len(filters) - len(v["http_filters"].([]any))
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(doc)
	if removed != 1 {
		return nil, fmt.Errorf("envoy config: found %d %s filters, want 1", removed, name)
	}
	return yaml.Marshal(doc)
}

// withEndpoints is an Envoy configuration whose capsnap cluster, whose
// one endpoint is addrs[0], has the others after it, round robin
// (Envoy's default policy), and is otherwise the same.
func withEndpoints(cfg []byte, addrs []string) ([]byte, error) {
	endpoints := make([][]byte, len(addrs))
	for i, a := range addrs {
		p, err := port(a)
		if err != nil {
			return nil, err
		}
		endpoints[i] = fmt.Appendf(nil, "        - endpoint:\n            address:\n              socket_address: {address: 127.0.0.1, port_value: %d}\n", p)
	}
	if bytes.Count(cfg, endpoints[0]) != 1 {
		return nil, errors.New("envoy config: no capsnap cluster with one endpoint to add to")
	}
	return bytes.Replace(cfg, endpoints[0], bytes.Join(endpoints, nil), 1), nil
}
