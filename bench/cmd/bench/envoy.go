package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// throughEnvoy posts MCP tools/call refunds through the real Envoy to
// billing, with no ext_authz, with ext_authz to the floor and with
// ext_authz to capsnap: three Envoys, identical but for the filter, each
// with its own warm sessions. refund, not lookup_order, because it is the
// call the gRPC cases measure and capsnap's most expensive allowed path
// (its schema, two CEL constraints and the sequence rule).
//
// The modes take turns (turnOrder), each turn a share of a mode's run: a
// machine that gets busier or quieter during the step weighs on every
// mode alike.
func (h *harness) throughEnvoy(ctx context.Context) error {
	method := &h.results.Method
	method.EnvoyWorkers, method.EnvoyPerWorker, method.EnvoyRun, method.EnvoyWarmup = envoyWorkers, envoyPerWorker, h.o.envoyRun, envoyWarmup
	method.EnvoyCall = "refund"

	// Without pins: only capsnap sends them, and billing's handler-start
	// check would refuse every call of the other two modes.
	billing, billingURL, err := h.startBilling(ctx, "billing-envoy", false)
	if err != nil {
		return err
	}
	defer h.stop(billing)
	cs, err := h.startCapsnap(ctx, "capsnap-envoy", billingURL, "{source: header, insecure_header: true}")
	if err != nil {
		return err
	}
	defer h.stop(cs.server)
	noop, noopAddr, _, err := h.startNoop("noop-envoy")
	if err != nil {
		return err
	}
	defer h.stop(noop)
	_, closeConn, err := dialCheck(ctx, noopAddr, checkRequest(refundBody, ""), noop)
	if err != nil {
		return err
	}
	closeConn()
	// The shared store (issue 15): capsnap on Redis, and two replicas
	// sharing that Redis under their own key prefix.
	redis, redisAddr, err := h.startRedis(ctx, "redis-envoy")
	if err != nil {
		return err
	}
	defer h.stop(redis)
	var onRedis [3]*capsnapServer
	for i, name := range []string{"capsnap-envoy-redis", "capsnap-envoy-replica-0", "capsnap-envoy-replica-1"} {
		prefix := "one:"
		if i > 0 {
			prefix = "two:"
		}
		snapshots, err := h.redisSnapshots(redisAddr, prefix)
		if err != nil {
			return err
		}
		c, err := h.startCapsnapWith(ctx, capsnapSpec{name: name, billingURL: billingURL, principal: "{source: header, insecure_header: true}",
			policy: cs.policy, snapshots: snapshots})
		if err != nil {
			return err
		}
		defer h.stop(c.server)
		onRedis[i] = c
	}
	capsnaps := append([]*capsnapServer{cs}, onRedis[:]...)
	denied := make([]float64, len(capsnaps))
	for i, c := range capsnaps {
		if _, denied[i], err = c.decisions(ctx); err != nil {
			return err
		}
	}

	authz := map[string][]string{
		report.ModeNone: nil, report.ModeFloor: {noopAddr}, report.ModeCapsnap: {cs.grpcAddr},
		report.ModeRedis: {onRedis[0].grpcAddr}, report.ModeReplicas: {onRedis[1].grpcAddr, onRedis[2].grpcAddr},
	}
	all := append(slices.Clone(report.Modes), report.StoreModes...)
	modes := map[string]*envoyMode{}
	for _, mode := range all {
		m, err := h.startMode(ctx, mode, billingURL, authz[mode])
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		defer m.close(h)
		modes[mode] = m
	}
	// Where each call's CPU goes: the processes that serve a mode's calls.
	authzProcs := map[string][]int{
		report.ModeFloor: {noop.Pid()}, report.ModeCapsnap: {cs.Pid()},
		report.ModeRedis: {onRedis[0].Pid()}, report.ModeReplicas: {onRedis[1].Pid(), onRedis[2].Pid()},
	}
	tallies := make([]*cpuTally, len(all))
	for i, mode := range all {
		procs := []process{{"Envoy", []int{modes[mode].envoy.Pid()}}, {"billing", []int{billing.Pid()}}}
		if pids := authzProcs[mode]; pids != nil {
			procs = append(procs, process{"the authorizer", pids})
		}
		if slices.Contains(report.StoreModes, mode) {
			procs = append(procs, process{"Redis", []int{redis.Pid()}})
		}
		tallies[i] = newCPUTally(append(procs, theLoad())...)
	}
	results, err := takeTurns(tallies, func(i int) (mcpload.Sample, error) {
		s, err := modes[all[i]].measure(ctx, h.o.envoyRun/turns, envoyPerWorker/turns)
		if err != nil {
			err = fmt.Errorf("%s: %w", all[i], err)
		}
		return s, err
	})
	if err != nil {
		return err
	}
	for i, c := range capsnaps {
		if _, after, err := c.decisions(ctx); err != nil || after != denied[i] {
			return fmt.Errorf("%s denied %.0f requests during the runs (%v): the figures would include denials", c.Name, after-denied[i], err)
		}
	}
	for i, mode := range all {
		res := results[i]
		h.results.Envoy = append(h.results.Envoy, report.EnvoyRun{Mode: mode, Result: res, CPU: tallies[i].perCall()})
		h.logf("   %-32s %7.0f calls/s  p50 %-9s p99 %s", mode, res.RPS, report.Dur(res.P50), report.Dur(res.P99))
	}
	return nil
}

// envoyMode is one Envoy and the warm sessions that load it.
type envoyMode struct {
	envoy  *server
	runner *mcpload.Runner
}

// startMode starts the Envoy of mode and opens and warms its sessions.
func (h *harness) startMode(ctx context.Context, mode, billingURL string, authz []string) (*envoyMode, error) {
	envoy, url, err := h.startEnvoy(ctx, mode, billingURL, authz)
	if err != nil {
		return nil, err
	}
	load := mcpload.Load{
		URL: url, Header: map[string]string{testbed.PrincipalHeader: agent},
		Setup: []byte(lookupBody), Call: []byte(refundBody),
		Workers: envoyWorkers, Warmup: envoyWarmup,
	}
	r, err := load.Start(ctx)
	if err != nil {
		h.stop(envoy)
		return nil, err
	}
	return &envoyMode{envoy: envoy, runner: r}, nil
}

// measure is one turn of the mode's load; its Envoy must outlive it.
func (m *envoyMode) measure(ctx context.Context, d time.Duration, perWorker int) (mcpload.Sample, error) {
	s, err := m.runner.Measure(ctx, d, perWorker)
	if err == nil {
		err = m.envoy.gone()
	}
	return s, err
}

func (m *envoyMode) close(h *harness) {
	m.runner.Close()
	h.stop(m.envoy)
}

// startEnvoy runs Envoy in front of billing, its ext_authz filter pointed
// at authz (none if empty; round robin over several), and returns it with
// its route to billing.
func (h *harness) startEnvoy(ctx context.Context, mode, billingURL string, authz []string) (*server, string, error) {
	name := map[string]string{
		report.ModeNone: "envoy-none", report.ModeFloor: "envoy-floor", report.ModeCapsnap: "envoy-capsnap",
		report.ModeRedis: "envoy-redis", report.ModeReplicas: "envoy-replicas",
	}[mode]
	if len(authz) == 0 {
		return h.startEnvoyNamed(ctx, name, billingURL, "", withoutExtAuthz)
	}
	var edit func([]byte) ([]byte, error)
	if len(authz) > 1 {
		edit = func(cfg []byte) ([]byte, error) { return withEndpoints(cfg, authz[1:]) }
	}
	return h.startEnvoyNamed(ctx, name, billingURL, authz[0], edit)
}

// startEnvoyNamed runs Envoy as name on envoy/demo.yaml in front of
// billing, its ext_authz and ext_proc filters pointed at authz, the
// configuration changed by edit if it is not nil, and returns it with its
// route to billing.
func (h *harness) startEnvoyNamed(ctx context.Context, name, billingURL, authz string, edit func([]byte) ([]byte, error)) (*server, string, error) {
	ports, err := envoyPorts(billingURL, authz)
	if err != nil {
		return nil, "", err
	}
	cfg := testbed.EnvoyConfig(ports)
	if edit != nil {
		if cfg, err = edit(cfg); err != nil {
			return nil, "", err
		}
	}
	path := filepath.Join(h.work, name+".yaml")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		return nil, "", err
	}
	// Without hot restart there is no shared memory: several Envoys run
	// side by side.
	envoy, err := h.start(name, h.envoy, "-c", path, "--disable-hot-restart", "--concurrency", "1", "-l", "warning")
	if err != nil {
		return nil, "", err
	}
	if err := h.waitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/ready", ports.EnvoyAdmin), envoy); err != nil {
		return envoy, "", err
	}
	return envoy, fmt.Sprintf("http://127.0.0.1:%d/billing/mcp", ports.Envoy), nil
}

// envoyPorts are envoy/demo.yaml's ports for this run: fresh ones for
// Envoy, billing's, and authz's for the ext_authz cluster.
func envoyPorts(billingURL, authz string) (testbed.Ports, error) {
	var p testbed.Ports
	for _, f := range []*int{&p.Envoy, &p.EnvoyAdmin, &p.Payments, &p.GRPC} {
		n, err := testbed.FreePort()
		if err != nil {
			return p, err
		}
		*f = n
	}
	u, err := url.Parse(billingURL)
	if err != nil {
		return p, err
	}
	if p.Billing, err = strconv.Atoi(u.Port()); err != nil {
		return p, err
	}
	if authz != "" {
		_, port, err := net.SplitHostPort(authz)
		if err != nil {
			return p, err
		}
		if p.GRPC, err = strconv.Atoi(port); err != nil {
			return p, err
		}
	}
	return p, nil
}

// The HTTP filters' names in envoy/demo.yaml: ext_authz, and the response
// path's ext_proc.
const (
	extAuthzFilter = "envoy.filters.http.ext_authz"
	extProcFilter  = "capsnap.ext_proc"
)

// withoutExtAuthz is an Envoy configuration without its ext_authz HTTP
// filter, and otherwise the same; the routes' per-filter settings for it
// stay, unused.
func withoutExtAuthz(cfg []byte) ([]byte, error) { return withoutFilter(cfg, extAuthzFilter) }

// withoutExtProc is an Envoy configuration without the response path (its
// capsnap.ext_proc HTTP filter), and otherwise the same.
func withoutExtProc(cfg []byte) ([]byte, error) { return withoutFilter(cfg, extProcFilter) }

// withoutFilter is an Envoy configuration without its one HTTP filter
// named name, and otherwise the same.
func withoutFilter(cfg []byte, name string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(cfg, &doc); err != nil {
		return nil, fmt.Errorf("envoy config: %w", err)
	}
	removed := 0
	var walk func(*yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == "http_filters" && n.Content[i+1].Kind == yaml.SequenceNode {
					removed += dropNamed(n.Content[i+1], name)
				}
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(&doc)
	if removed != 1 {
		return nil, fmt.Errorf("envoy config: found %d %s filters, want 1", removed, name)
	}
	return yaml.Marshal(&doc)
}

// withEndpoints is an Envoy configuration whose capsnap cluster has
// addrs as further endpoints after its one, round robin (Envoy's default
// policy), and is otherwise the same.
func withEndpoints(cfg []byte, addrs []string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(cfg, &doc); err != nil {
		return nil, fmt.Errorf("envoy config: %w", err)
	}
	var lbEndpoints *yaml.Node
	if root := doc.Content; len(root) == 1 {
		if clusters := mappingNode(root[0], "static_resources", "clusters"); clusters != nil && clusters.Kind == yaml.SequenceNode {
			for _, c := range clusters.Content {
				if mappingValue(c, "name") != "capsnap" {
					continue
				}
				if eps := mappingNode(c, "load_assignment", "endpoints"); eps != nil && eps.Kind == yaml.SequenceNode && len(eps.Content) == 1 {
					lbEndpoints = mappingNode(eps.Content[0], "lb_endpoints")
				}
			}
		}
	}
	if lbEndpoints == nil || lbEndpoints.Kind != yaml.SequenceNode || len(lbEndpoints.Content) != 1 {
		return nil, errors.New("envoy config: no capsnap cluster with one endpoint to add to")
	}
	for _, addr := range addrs {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		var ep yaml.Node
		if err := yaml.Unmarshal([]byte(fmt.Sprintf("endpoint: {address: {socket_address: {address: %q, port_value: %s}}}", host, port)), &ep); err != nil {
			return nil, err
		}
		lbEndpoints.Content = append(lbEndpoints.Content, ep.Content[0])
	}
	return yaml.Marshal(&doc)
}

// mappingNode follows keys down nested mappings from m; nil if one is
// missing.
func mappingNode(m *yaml.Node, keys ...string) *yaml.Node {
	for _, key := range keys {
		var next *yaml.Node
		if m.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(m.Content); i += 2 {
				if m.Content[i].Value == key {
					next = m.Content[i+1]
				}
			}
		}
		if next == nil {
			return nil
		}
		m = next
	}
	return m
}

// dropNamed removes from seq every mapping whose name is name.
func dropNamed(seq *yaml.Node, name string) int {
	kept := seq.Content[:0]
	dropped := 0
	for _, item := range seq.Content {
		if item.Kind == yaml.MappingNode && mappingValue(item, "name") == name {
			dropped++
			continue
		}
		kept = append(kept, item)
	}
	seq.Content = kept
	return dropped
}

func mappingValue(m *yaml.Node, key string) string {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1].Value
		}
	}
	return ""
}
