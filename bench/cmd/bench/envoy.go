package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
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
// billing, with no ext_authz, with ext_authz to the floor and with
// ext_authz to capsnap, and on the shared store (issue 15) to capsnap on
// Redis and to two replicas sharing that Redis under their own key
// prefix: an Envoy per mode, identical but for the filter and its
// cluster, each with its own warm sessions. refund, not lookup_order,
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
	noop, noopAddr, _, err := h.startNoop("noop-envoy")
	if err != nil {
		return err
	}
	if _, err := h.dialCheck(ctx, noopAddr, checkRequest(refundBody, ""), noop); err != nil {
		return err
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
	// Each mode's Envoy and the ext_authz servers it asks, round robin;
	// and the processes that serve its calls, by which a call's CPU is
	// split.
	floor := &capsnapServer{server: noop, grpcAddr: noopAddr}
	modes := []struct {
		name, envoy string
		authz       []*capsnapServer
	}{
		{report.ModeNone, "envoy-none", nil}, {report.ModeFloor, "envoy-floor", []*capsnapServer{floor}},
		{report.ModeCapsnap, "envoy-capsnap", capsnaps[:1]}, {report.ModeRedis, "envoy-redis", capsnaps[1:2]},
		{report.ModeReplicas, "envoy-replicas", capsnaps[2:]},
	}
	var names []string
	envoys := make([]*server, len(modes))
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
		if envoys[i], url, err = h.startEnvoy(ctx, mode.envoy, billingURL, to, edit); err != nil {
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
	for i, mode := range names {
		res := results[i]
		h.results.Envoy = append(h.results.Envoy, report.EnvoyRun{Mode: mode, Result: res, CPU: tallies[i].perCall()})
		h.logf("   %-32s %7.0f calls/s  p50 %-9s p99 %s", mode, res.RPS, report.Dur(res.P50), report.Dur(res.P99))
	}
	return nil
}

// startEnvoy runs Envoy as name on envoy/demo.yaml in front of billing,
// its ext_authz and ext_proc filters pointed at authz (round robin over
// several; at a closed port if none), the configuration changed by edit
// if it is not nil, and returns it with its route to billing.
func (h *harness) startEnvoy(ctx context.Context, name, billingURL string, authz []string, edit func([]byte) ([]byte, error)) (*server, string, error) {
	var p testbed.Ports
	for _, f := range []*int{&p.Envoy, &p.EnvoyAdmin, &p.Payments, &p.GRPC} {
		n, err := testbed.FreePort()
		if err != nil {
			return nil, "", err
		}
		*f = n
	}
	var err error
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
		return nil, "", err
	}
	// Without hot restart there is no shared memory: several Envoys run
	// side by side.
	envoy, err := h.start(name, h.envoy, "-c", path, "--disable-hot-restart", "--concurrency", "1", "-l", "warning")
	if err == nil {
		err = envoy.awaitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/ready", p.EnvoyAdmin))
	}
	return envoy, fmt.Sprintf("http://127.0.0.1:%d/billing/mcp", p.Envoy), err
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
