package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/rueidis"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/capsnap/capsnap/bench/opa"
)

// demoPolicy is the policy capsnap runs under but in the response path's
// case.
const demoPolicy = "examples/demo/policy.yaml"

// startBilling starts the billing MCP server; pin is its handler-start
// pin check (package pincheck), which only capsnap's allows satisfy.
func (h *harness) startBilling(ctx context.Context, name string, pin bool) (*server, string, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	s, err := h.start(name, h.billing, "-addr", addr, "-variant", "baseline", fmt.Sprintf("-pin=%v", pin))
	if err != nil {
		return nil, "", err
	}
	url := "http://" + addr
	return s, url, s.awaitHTTP(ctx, url+"/admin/stats")
}

// capsnapServer is a running capsnap.
type capsnapServer struct {
	*server
	grpcAddr, adminURL string
}

// capsnapSpec is one capsnap's configuration.
type capsnapSpec struct {
	name, billingURL string
	// principal is capsnap's principal section, a YAML flow mapping.
	principal string
	// policy is the demo's if nil.
	policy []byte
	// extra is more of capsnap.yaml, top-level sections such as
	// "discovery: {bind: catalog}\n".
	extra string
	// servers, if set, is capsnap.yaml's servers section (a YAML block
	// starting "servers:") in place of billing at billingURL; snapshots,
	// if set, its snapshots section (a YAML flow mapping) in place of
	// {ttl: 30m} on the memory store.
	servers, snapshots string
	// grantKeyFile, if set, is billing's grant_key_file in the default
	// servers section.
	grantKeyFile string
}

// startCapsnap starts capsnap as spec says and waits until its catalog is
// live (/readyz).
func (h *harness) startCapsnap(ctx context.Context, spec capsnapSpec) (*capsnapServer, error) {
	dir := filepath.Join(h.work, spec.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	addrs, err := freeAddrs(2) // gRPC, admin
	if err == nil && spec.policy == nil {
		spec.policy, err = os.ReadFile(demoPolicy)
	}
	if err != nil {
		return nil, err
	}
	audit, err := filepath.Abs(filepath.Join(h.logs, spec.name+".audit.log"))
	if err != nil {
		return nil, err
	}
	// Snapshots outlive the run (ttl); the catalog is billing's, resynced
	// on list_changed and capsnap's default timer.
	if spec.servers == "" {
		spec.servers = fmt.Sprintf("servers:\n  - id: billing\n    url: %s/mcp\n", spec.billingURL)
		if spec.grantKeyFile != "" {
			spec.servers += fmt.Sprintf("    grant_key_file: %q\n", spec.grantKeyFile)
		}
	}
	if spec.snapshots == "" {
		spec.snapshots = "{ttl: 30m}"
	}
	cfg := fmt.Sprintf(`grpc_addr: %s
admin_addr: %s
policy_file: policy.yaml
principal: %s
%ssnapshots: %s
log: {level: info, format: json}
audit: {path: %s}
debug: {pprof: true}
%s`, addrs[0], addrs[1], spec.principal, spec.servers, spec.snapshots, audit, spec.extra)
	for file, b := range map[string][]byte{"policy.yaml": spec.policy, "capsnap.yaml": []byte(cfg)} {
		if err := os.WriteFile(filepath.Join(dir, file), b, 0o600); err != nil {
			return nil, err
		}
	}
	s, err := h.start(spec.name, h.capsnap, "serve", "--config", filepath.Join(dir, "capsnap.yaml"))
	if err != nil {
		return nil, err
	}
	c := &capsnapServer{server: s, grpcAddr: addrs[0], adminURL: "http://" + addrs[1]}
	return c, s.awaitHTTP(ctx, c.adminURL+"/readyz")
}

// decisions is capsnap's capsnap_decisions_total by decision (allow,
// deny).
func (c *capsnapServer) decisions(ctx context.Context) (map[string]float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.adminURL+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("capsnap metrics: %w", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("capsnap metrics: %w", err)
	}
	byDecision := map[string]float64{}
	for _, m := range families["capsnap_decisions_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "decision" {
				byDecision[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
	return byDecision, nil
}

// decided runs f and returns how many requests each of capsnaps allowed
// meanwhile; one that denied any fails it: the figures would include
// denials.
func decided(ctx context.Context, capsnaps []*capsnapServer, f func() error) ([]float64, error) {
	before := make([]map[string]float64, len(capsnaps))
	for i, c := range capsnaps {
		var err error
		if before[i], err = c.decisions(ctx); err != nil {
			return nil, err
		}
	}
	if err := f(); err != nil {
		return nil, err
	}
	allowed := make([]float64, len(capsnaps))
	for i, c := range capsnaps {
		after, err := c.decisions(ctx)
		if err == nil && after["deny"] != before[i]["deny"] {
			err = fmt.Errorf("%s denied %.0f requests during the runs: the figures would include denials", c.Name, after["deny"]-before[i]["deny"])
		}
		if err != nil {
			return nil, err
		}
		allowed[i] = after["allow"] - before[i]["allow"]
	}
	return allowed, nil
}

// startNoop starts the floor with args, serving its profiles at pprofURL.
func (h *harness) startNoop(name string, args ...string) (s *server, addr, pprofURL string, err error) {
	addrs, err := freeAddrs(2)
	if err == nil {
		s, err = h.start(name, h.noop, append([]string{"-addr", addrs[0], "-pprof", addrs[1]}, args...)...)
	}
	return s, addrs[0], "http://" + addrs[1], err
}

// startOPA starts OPA-Envoy on bench/opa's policy, with its data's
// snapshot under epoch, and waits until its plugins are up.
func (h *harness) startOPA(ctx context.Context, epoch string) (*server, string, error) {
	dir := filepath.Join(h.work, "opa")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	addrs, err := freeAddrs(3) // gRPC, the REST API, diagnostics
	if err != nil {
		return nil, "", err
	}
	args, err := opa.Files(dir, epoch, addrs[0], addrs[1], addrs[2])
	if err != nil {
		return nil, "", err
	}
	s, err := h.start("opa-envoy", h.opaEnvoy, args...)
	if err != nil {
		return nil, "", err
	}
	// /health?plugins answers 200 once every plugin, the gRPC one
	// included, reports OK.
	return s, addrs[0], s.awaitHTTP(ctx, "http://"+addrs[2]+"/health?plugins")
}

// startRedis starts an empty redis-server without persistence on a free
// loopback port, as testbed.StartRedis does, and returns it with its
// address once it answers PING.
func (h *harness) startRedis(ctx context.Context, name string) (*server, string, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	_, port, _ := strings.Cut(addr, ":")
	dir := filepath.Join(h.work, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	s, err := h.start(name, h.redis, "--port", port, "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--loglevel", "warning")
	if err != nil {
		return nil, "", err
	}
	return s, addr, s.await(ctx, func(ctx context.Context) error {
		c, err := redisClient(addr)
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Do(ctx, c.B().Ping().Build()).Error()
	})
}

func redisClient(addr string) (rueidis.Client, error) {
	return rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
}

// dialCheck connects to an ext_authz server at addr until the step ends,
// and waits until a Check of req is allowed.
func (h *harness) dialCheck(ctx context.Context, addr string, req *authv3.CheckRequest, s *server) (authv3.AuthorizationClient, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	h.later(func() { conn.Close() })
	client := authv3.NewAuthorizationClient(conn)
	return client, s.await(ctx, func(ctx context.Context) error { return checkOnce(ctx, client, req) })
}

// checkOnce sends req and requires an allow.
func checkOnce(ctx context.Context, c authv3.AuthorizationClient, req *authv3.CheckRequest) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, req)
	if err != nil {
		return err
	}
	return allowed(resp)
}
