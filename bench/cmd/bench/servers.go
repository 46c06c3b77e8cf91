package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/capsnap/capsnap/bench/opa"
)

// demoPolicy is the policy capsnap runs under in every case.
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
	return s, url, h.waitHTTP(ctx, url+"/admin/stats", s)
}

// capsnapServer is a running capsnap.
type capsnapServer struct {
	*server
	grpcAddr, adminURL string
	// policy is the policy it runs.
	policy []byte
}

// startCapsnap starts capsnap deciding for billing at billingURL under
// the demo policy, taking the principal as principal (a YAML flow
// mapping) says, and waits until its catalog is live (/readyz).
func (h *harness) startCapsnap(ctx context.Context, name, billingURL, principal string) (*capsnapServer, error) {
	policy, err := os.ReadFile(demoPolicy)
	if err != nil {
		return nil, err
	}
	return h.startCapsnapWith(ctx, capsnapSpec{name: name, billingURL: billingURL, principal: principal, policy: policy})
}

// capsnapSpec is one capsnap's configuration.
type capsnapSpec struct {
	name, billingURL string
	// principal is capsnap's principal section, a YAML flow mapping.
	principal string
	policy    []byte
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

// startCapsnapWith starts capsnap as spec says, its one server billing at
// spec.billingURL, and waits until its catalog is live (/readyz).
func (h *harness) startCapsnapWith(ctx context.Context, spec capsnapSpec) (*capsnapServer, error) {
	name := spec.name
	dir := filepath.Join(h.work, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	grpcAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	adminAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	audit, err := filepath.Abs(filepath.Join(h.logs, name+".audit.log"))
	if err != nil {
		return nil, err
	}
	// Snapshots outlive the run (ttl); the catalog is billing's, resynced
	// on list_changed and capsnap's default timer.
	servers := spec.servers
	if servers == "" {
		servers = fmt.Sprintf("servers:\n  - id: billing\n    url: %s/mcp\n", spec.billingURL)
		if spec.grantKeyFile != "" {
			servers += fmt.Sprintf("    grant_key_file: %q\n", spec.grantKeyFile)
		}
	}
	snapshots := spec.snapshots
	if snapshots == "" {
		snapshots = "{ttl: 30m}"
	}
	cfg := fmt.Sprintf(`grpc_addr: %s
admin_addr: %s
policy_file: policy.yaml
principal: %s
%ssnapshots: %s
log: {level: info, format: json}
audit: {path: %s}
debug: {pprof: true}
%s`, grpcAddr, adminAddr, spec.principal, servers, snapshots, audit, spec.extra)
	for file, b := range map[string][]byte{"policy.yaml": spec.policy, "capsnap.yaml": []byte(cfg)} {
		if err := os.WriteFile(filepath.Join(dir, file), b, 0o600); err != nil {
			return nil, err
		}
	}
	s, err := h.start(name, h.capsnap, "serve", "--config", filepath.Join(dir, "capsnap.yaml"))
	if err != nil {
		return nil, err
	}
	c := &capsnapServer{server: s, grpcAddr: grpcAddr, adminURL: "http://" + adminAddr, policy: spec.policy}
	return c, h.waitHTTP(ctx, c.adminURL+"/readyz", s)
}

// decisions is capsnap's capsnap_decisions_total, allows and denials.
func (c *capsnapServer) decisions(ctx context.Context) (allow, deny float64, err error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.adminURL+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("capsnap metrics: %w", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, 0, fmt.Errorf("capsnap metrics: %w", err)
	}
	for _, m := range families["capsnap_decisions_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() != "decision" {
				continue
			}
			switch l.GetValue() {
			case "allow":
				allow += m.GetCounter().GetValue()
			case "deny":
				deny += m.GetCounter().GetValue()
			}
		}
	}
	return allow, deny, nil
}

// startNoop starts the floor, serving its profiles at pprofURL.
func (h *harness) startNoop(name string) (s *server, addr, pprofURL string, err error) {
	if addr, err = freeAddr(); err != nil {
		return nil, "", "", err
	}
	pprofAddr, err := freeAddr()
	if err != nil {
		return nil, "", "", err
	}
	s, err = h.start(name, h.noop, "-addr", addr, "-pprof", pprofAddr)
	return s, addr, "http://" + pprofAddr, err
}

// startOPA starts OPA-Envoy on bench/opa's policy, with its data's
// snapshot under epoch, and waits until its plugins are up.
func (h *harness) startOPA(ctx context.Context, epoch string) (*server, string, error) {
	dir := filepath.Join(h.work, "opa")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	var addrs [3]string
	for i := range addrs {
		a, err := freeAddr()
		if err != nil {
			return nil, "", err
		}
		addrs[i] = a
	}
	grpcAddr, apiAddr, diagAddr := addrs[0], addrs[1], addrs[2]
	args, err := opa.Files(dir, epoch, grpcAddr, apiAddr, diagAddr)
	if err != nil {
		return nil, "", err
	}
	s, err := h.start("opa-envoy", h.opaEnvoy, args...)
	if err != nil {
		return nil, "", err
	}
	// /health?plugins answers 200 once every plugin, the gRPC one
	// included, reports OK.
	return s, grpcAddr, h.waitHTTP(ctx, "http://"+diagAddr+"/health?plugins", s)
}

// dialCheck connects to an ext_authz server at addr and waits until a
// Check of req answers (any transport error but Unavailable is final);
// the answer must be an allow.
func dialCheck(ctx context.Context, addr string, req *authv3.CheckRequest, s *server) (authv3.AuthorizationClient, func(), error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	client := authv3.NewAuthorizationClient(conn)
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		err := checkOnce(ctx, client, req)
		if err == nil {
			return client, func() { conn.Close() }, nil
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("%s: first Check: %w; %s", s.Name, err, s.tail())
		}
		if err := s.gone(); err != nil {
			conn.Close()
			return nil, nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
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
