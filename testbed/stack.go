package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/capsnap/capsnap/envoy"
)

// Ports are the loopback ports of one stack.
type Ports struct {
	Envoy, EnvoyAdmin, GRPC, Admin, Billing, Payments int
	// GRPC2 and Admin2 are the second capsnap replica's, with
	// StackOptions.Redis.
	GRPC2, Admin2 int
	// Approvals and Approvals2 are each replica's approval page and API,
	// with StackOptions.Approvals.
	Approvals, Approvals2 int
}

// DemoPorts are the ports envoy/demo.yaml and capsnap's defaults use.
var DemoPorts = Ports{Envoy: 10000, EnvoyAdmin: 9901, GRPC: 9001, Admin: 9002, Billing: 8081, Payments: 8082, GRPC2: 9011, Admin2: 9012, Approvals: 9003, Approvals2: 9013}

// RandomPorts picks free ports, so that tests can run side by side.
func RandomPorts() (Ports, error) {
	var p Ports
	for _, f := range []*int{&p.Envoy, &p.EnvoyAdmin, &p.GRPC, &p.Admin, &p.Billing, &p.Payments, &p.GRPC2, &p.Admin2, &p.Approvals, &p.Approvals2} {
		n, err := FreePort()
		if err != nil {
			return Ports{}, err
		}
		*f = n
	}
	return p, nil
}

// EnvoyConfig is envoy/demo.yaml with its ports replaced by p's.
func EnvoyConfig(p Ports) []byte { return render(envoy.Demo, p, strings.NewReplacer()) }

// StackOptions configure StartStack.
type StackOptions struct {
	// Capsnap and Billing are the built binaries.
	Capsnap, Billing string
	// Envoy is the Envoy binary.
	Envoy string
	Ports Ports
	// Dir holds the generated configuration files.
	Dir string
	// Policy is the policy file's content.
	Policy []byte
	// Tee, if set, also receives every process's output.
	Tee io.Writer
	// SnapshotTTL is capsnap's snapshots.ttl; zero means 5m.
	SnapshotTTL time.Duration
	// AllowStaleReads is capsnap's catalog.allow_stale_reads.
	AllowStaleReads bool
	// EnvoyYAML, if set, is the Envoy configuration to run, already
	// rendered for Ports (MTLSEnvoyConfig, JWTEnvoyConfig); nil runs
	// EnvoyConfig(Ports).
	EnvoyYAML []byte
	// Principal, if set, is capsnap's principal section as a YAML flow
	// mapping, e.g. "{source: mtls}"; empty trusts the development header.
	Principal string
	// GRPCTLS, if set, is capsnap's grpc_tls section as a YAML flow
	// mapping (CapsnapTLS renders envoy/mtls.yaml's); empty: plaintext.
	GRPCTLS string
	// AdminTokenFile, if set, is capsnap's admin.token_file.
	AdminTokenFile string
	// ServerArgs are passed to both server processes after -addr and
	// -variant, e.g. testbed/cmd/mcpfixture's -mode.
	ServerArgs []string
	// Denials, if set, is capsnap's denials section as a YAML flow
	// mapping, e.g. "{status: http_error}"; empty takes the defaults.
	Denials string
	// ServerCommand, if set, runs each of the two servers in place of
	// Billing: a server the testbed did not build. It returns, for server
	// id ("billing" or "payments") to listen on addr (127.0.0.1:port),
	// the program, its arguments, and environment variables (KEY=VALUE)
	// to add to this process's (set through env(1)). ServerArgs and the
	// variants are then not used. The server must serve streamable HTTP
	// at /mcp, where capsnap and Envoy's routes reach it; it need not
	// serve /admin/stats: it is ready once a GET of /mcp gets any HTTP
	// answer (an MCP endpoint may refuse a bare GET). The billing
	// server's admin calls (Stats, ServerStats, Redeploy,
	// RollOutHandlers) reach it only if it serves them too, as
	// verifiers/python/example/server.py serves /admin/stats and
	// /admin/variant.
	ServerCommand func(id, addr string) (bin string, args []string, env []string)
	// Redis, if set, is the address of a Redis: two capsnap replicas then
	// share it as their snapshot store, behind one Envoy cluster (round
	// robin, gRPC health-checked). Replica 0 is Capsnap.
	Redis string
	// CrossReplicas, with Redis, sends every Check to replica 0 and every
	// ext_proc stream to replica 1, in place of round robin over both.
	CrossReplicas bool
	// Envelope makes capsnap sign the envelope of every allowed call with
	// a key the stack writes (EnvelopeKey), and the billing servers check
	// it (pincheck) against the JWKS capsnap serves.
	Envelope bool
	// Grants, with Envelope, gives each server a grant key the stack
	// writes (GrantKeyFile): capsnap then sends envelopes under a grant
	// (servers[].grant_key_file), and the billing servers open them with
	// the key (-grant-key).
	Grants bool
	// MaxResponseBytes, if set, is capsnap's discovery.max_response_bytes.
	MaxResponseBytes int
	// Mode, if set, is capsnap's top-level mode (enforce or observe).
	Mode string
	// Tracing, if set, is capsnap's tracing section as a YAML flow
	// mapping, e.g. "{endpoint: 127.0.0.1:4317, insecure: true}".
	Tracing string
	// ReleaseOnError sets billing's servers[].release_on_error: a failed
	// call gives back what it reserved of its budgets.
	ReleaseOnError bool
	// CallsWithoutListing sets billing's servers[].calls_without_listing:
	// a caller with no snapshot on it may call.
	CallsWithoutListing bool
	// Approvals serves each replica's approval page and API on its
	// Ports.Approvals, its approvers the development tokens ApproverToken
	// (OnCall, in group billing-oncall) and OutsiderToken.
	Approvals bool
	// ProtocolVersion, if set, is both servers' servers[].protocol_version:
	// the MCP version capsnap's own catalog session asks for.
	ProtocolVersion string
}

// The approvers of a stack with StackOptions.Approvals.
const (
	OnCall        = "oncall@acme.example"
	ApproverToken = "testbed-oncall-token-0001"
	OutsiderToken = "testbed-outsider-token-01"
)

// approverTokens is the development tokens file of StackOptions.Approvals.
const approverTokens = `tokens:
  - {token: ` + ApproverToken + `, approver: ` + OnCall + `, groups: [billing-oncall]}
  - {token: ` + OutsiderToken + `, approver: outsider@acme.example, groups: [sales]}
`

// ApprovalsURL is replica 0's approval page and API.
func (s *Stack) ApprovalsURL() string { return "http://" + addr(s.opts.Ports.Approvals) }

// Stack is Envoy in front of two billing servers, "billing" and
// "payments" (the second serves another contract under the same tool
// names), with capsnap deciding.
type Stack struct {
	opts                              StackOptions
	Envoy, Capsnap, Billing, Payments *Process
	// Replica2 is the second capsnap replica, with StackOptions.Redis.
	Replica2 *Process
	// envelopeKeys are capsnap's envelope.key_files.
	envelopeKeys []string
	// EnvoyVersion is what the running Envoy says it is.
	EnvoyVersion string
}

// Servers are the stack's MCP servers, by server_id.
var Servers = []string{"billing", "payments"}

// StartStack starts billing, capsnap and Envoy, and waits until each is ready.
func StartStack(ctx context.Context, o StackOptions) (_ *Stack, err error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	s := &Stack{opts: o}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.EnvoyVersion, err = EnvoyVersion(o.Envoy); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.Dir, "policy.yaml"), o.Policy, 0o600); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	if err := s.writeCapsnapConfigs(); err != nil {
		return nil, err
	}
	envoyYAML := o.EnvoyYAML
	if envoyYAML == nil {
		envoyYAML = EnvoyConfig(o.Ports)
	}
	switch {
	case o.Redis != "" && o.CrossReplicas:
		envoyYAML = crossReplicas(envoyYAML, o.Ports)
	case o.Redis != "":
		envoyYAML = replicaCluster(envoyYAML, o.Ports)
	}
	if err := os.WriteFile(filepath.Join(o.Dir, "envoy.yaml"), envoyYAML, 0o600); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}

	if s.Billing, err = s.startServer(ctx, "billing", "baseline"); err != nil {
		return nil, err
	}
	if s.Payments, err = s.startServer(ctx, "payments", "schema_swap"); err != nil {
		return nil, err
	}
	if err := s.StartCapsnap(ctx); err != nil {
		return nil, err
	}
	if o.Redis != "" {
		if err := s.StartReplica(ctx, 1); err != nil {
			return nil, err
		}
	}
	s.Envoy, err = Start("envoy", o.Envoy, []string{
		"-c", filepath.Join(o.Dir, "envoy.yaml"),
		"--disable-hot-restart", "--concurrency", "1", "-l", "warning",
	}, o.Tee)
	if err != nil {
		return nil, err
	}
	if err := WaitHTTP(ctx, fmt.Sprintf("http://%s/ready", addr(o.Ports.EnvoyAdmin)), s.Envoy); err != nil {
		return nil, err
	}
	return s, nil
}

// startServer starts one billing process as server id, serving variant,
// or StackOptions.ServerCommand's server if it is set.
func (s *Stack) startServer(ctx context.Context, id, variant string) (*Process, error) {
	if s.opts.ServerCommand != nil {
		return s.startCommand(ctx, id)
	}
	args := append([]string{"-addr", s.serverAddr(id), "-variant", variant}, s.opts.ServerArgs...)
	if s.opts.Envelope {
		args = append(args, "-server-id", id, "-jwks", s.ReplicaAdminURL(0)+"/.well-known/jwks.json")
		if s.opts.Grants {
			args = append(args, "-grant-key", GrantKeyFile(s.opts.Dir, id))
		}
	}
	p, err := Start(id, s.opts.Billing, args, s.opts.Tee)
	if err != nil {
		return nil, err
	}
	if err := WaitHTTP(ctx, s.ServerURL(id)+"/admin/stats", p); err != nil {
		return nil, err
	}
	return p, nil
}

// startCommand starts StackOptions.ServerCommand's server as server id and
// waits until its MCP endpoint answers.
func (s *Stack) startCommand(ctx context.Context, id string) (*Process, error) {
	bin, args, env := s.opts.ServerCommand(id, s.serverAddr(id))
	if len(env) > 0 {
		// env(1) execs bin in its place: the process Stop signals is
		// the server itself.
		envBin, err := exec.LookPath("env")
		if err != nil {
			return nil, fmt.Errorf("stack: server %s: %w", id, err)
		}
		args = append(append(append([]string{}, env...), bin), args...)
		bin = envBin
	}
	p, err := Start(id, bin, args, s.opts.Tee)
	if err != nil {
		return nil, err
	}
	if err := waitAnswer(ctx, s.ServerURL(id)+"/mcp", p); err != nil {
		_ = p.Stop()
		return nil, err
	}
	return p, nil
}

// waitAnswer polls url with GET until it gets any HTTP response or ctx
// ends, giving up early if p exits.
func waitAnswer(ctx context.Context, url string, p *Process) error {
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("%s exited before %s answered: %v\n%s", p.Name, url, p.err, p.Output())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w", url, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// RestartServer starts server id again after it was stopped, serving variant.
func (s *Stack) RestartServer(ctx context.Context, id, variant string) error {
	p, err := s.startServer(ctx, id, variant)
	if err != nil {
		return err
	}
	if id == "billing" {
		s.Billing = p
	} else {
		s.Payments = p
	}
	return nil
}

func (s *Stack) serverAddr(id string) string {
	if id == "payments" {
		return addr(s.opts.Ports.Payments)
	}
	return addr(s.opts.Ports.Billing)
}

// capsnapConfig is replica's capsnap.yaml; servers, if not nil, replaces
// its servers section.
func (s *Stack) capsnapConfig(replica int, servers string) string {
	ttl := s.opts.SnapshotTTL
	if ttl == 0 {
		ttl = 5 * time.Minute
	}
	principal := "# Development only: the demo has no mTLS, so the client names itself.\nprincipal: {source: header, insecure_header: true}"
	if s.opts.Principal != "" {
		principal = "principal: " + s.opts.Principal
	}
	if s.opts.GRPCTLS != "" {
		principal += "\ngrpc_tls: " + s.opts.GRPCTLS
	}
	if s.opts.AdminTokenFile != "" {
		principal += fmt.Sprintf("\nadmin: {token_file: %q}", s.opts.AdminTokenFile)
	}
	// sections are the optional top-level sections, one a line.
	sections := ""
	if s.opts.Denials != "" {
		sections = "denials: " + s.opts.Denials
	}
	if servers == "" {
		release := ""
		// own is what the configuration says of server id alone.
		own := func(id string) string {
			out := ""
			if s.opts.ProtocolVersion != "" {
				out = "\n    protocol_version: " + s.opts.ProtocolVersion
			}
			if s.opts.Grants {
				out += "\n    grant_key_file: " + GrantKeyFile(s.opts.Dir, id) + ".pub"
			}
			return out
		}
		if s.opts.ReleaseOnError {
			release = "\n    release_on_error: true"
		}
		if s.opts.CallsWithoutListing {
			release += "\n    calls_without_listing: true"
		}
		servers = fmt.Sprintf(`servers:
  - id: billing
    url: %s/mcp
    resync_interval: 2s%s%s
  - id: payments
    url: %s/mcp
    resync_interval: 2s%s`, s.ServerURL("billing"), own("billing"), release, s.ServerURL("payments"), own("payments"))
	}
	if len(s.envelopeKeys) > 0 {
		sections += fmt.Sprintf("\nenvelope: {key_files: [%s]}", strings.Join(s.envelopeKeys, ", "))
	}
	if s.opts.MaxResponseBytes > 0 {
		sections += fmt.Sprintf("\ndiscovery: {max_response_bytes: %d}", s.opts.MaxResponseBytes)
	}
	if s.opts.Mode != "" {
		sections += "\nmode: " + s.opts.Mode
	}
	if s.opts.Tracing != "" {
		sections += "\ntracing: " + s.opts.Tracing
	}
	if s.opts.Approvals {
		port := s.opts.Ports.Approvals
		if replica == 1 {
			port = s.opts.Ports.Approvals2
		}
		sections += fmt.Sprintf("\napprovals: {addr: %q, auth: {dev_tokens_file: approvers.yaml}}", addr(port))
	}
	snapshots := fmt.Sprintf("snapshots: {ttl: %s}", ttl)
	if s.opts.Redis != "" {
		// Probed often, so that the tests see Redis go and come back
		// quickly; drained, so that a replica stopping loses no Check.
		snapshots = fmt.Sprintf("snapshots: {ttl: %s, store: redis, redis: {addr: %q, secret_file: snapshot.key, probe_interval: 100ms}}\ndrain: 600ms", ttl, s.opts.Redis)
	}
	return fmt.Sprintf(`grpc_addr: %s
admin_addr: %s
policy_file: policy.yaml
%s
%s
%s
%s
catalog: {max_age: 10s, allow_stale_reads: %t}
log: {level: info, format: json}
`, addr(s.grpcPort(replica)), addr(s.adminPort(replica)), principal, sections, servers, snapshots, s.opts.AllowStaleReads)
}

// StartCapsnap (re)starts capsnap and waits until its catalog is ready.
func (s *Stack) StartCapsnap(ctx context.Context) error { return s.StartReplica(ctx, 0) }

// MCPURL is the billing server's MCP endpoint behind Envoy.
func (s *Stack) MCPURL() string { return s.RouteURL("billing") }

// RouteURL is server id's MCP endpoint behind Envoy.
func (s *Stack) RouteURL(id string) string {
	return fmt.Sprintf("http://%s/%s/mcp", addr(s.opts.Ports.Envoy), id)
}

// ServerURL is server id itself, bypassing Envoy.
func (s *Stack) ServerURL(id string) string { return "http://" + s.serverAddr(id) }

// Dir holds the stack's generated files: capsnap.yaml, policy.yaml,
// envoy.yaml.
func (s *Stack) Dir() string { return s.opts.Dir }

// AdminAddr is capsnap's admin listener address.
func (s *Stack) AdminAddr() string { return addr(s.opts.Ports.Admin) }

// GRPCAddr is capsnap's ext_authz and health address.
func (s *Stack) GRPCAddr() string { return addr(s.opts.Ports.GRPC) }

// AdminURL is capsnap's admin listener.
func (s *Stack) AdminURL() string { return "http://" + addr(s.opts.Ports.Admin) }

// BillingStats is what the billing server reports of itself.
type BillingStats struct {
	Variant       string         `json:"variant"`
	HandlerStarts map[string]int `json:"handler_starts"`
}

// Stats asks the billing server how often each handler started.
func (s *Stack) Stats(ctx context.Context) (BillingStats, error) {
	return s.ServerStats(ctx, "billing")
}

// ServerStats asks server id how often each handler started.
func (s *Stack) ServerStats(ctx context.Context, id string) (BillingStats, error) {
	var st BillingStats
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.ServerURL(id)+"/admin/stats", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("billing stats: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("billing stats: %w", err)
	}
	return st, nil
}

// Redeploy switches server id to another variant of its tools, which
// makes it send notifications/tools/list_changed.
func (s *Stack) Redeploy(ctx context.Context, id, variant string) error {
	return s.deploy(ctx, id, "/admin/variant", variant)
}

// RollOutHandlers switches only server id's handlers to variant, leaving
// its listing (and so capsnap's view) on the old contract.
func (s *Stack) RollOutHandlers(ctx context.Context, id, variant string) error {
	return s.deploy(ctx, id, "/admin/handlers", variant)
}

func (s *Stack) deploy(ctx context.Context, id, path, variant string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.ServerURL(id)+path, strings.NewReader(variant))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("redeploy %s: %w", id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("redeploy %s to %q: %s: %s", id, variant, resp.Status, b)
	}
	return nil
}

// Close stops every process, Envoy first.
func (s *Stack) Close() {
	for _, p := range []*Process{s.Envoy, s.Capsnap, s.Replica2, s.Billing, s.Payments} {
		if p != nil {
			_ = p.Stop()
		}
	}
}

func addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// readyTimeout bounds how long a whole stack may take to come up.
const readyTimeout = 30 * time.Second

// ReloadPolicy replaces capsnap's policy file and sends it SIGHUP, then
// waits until capsnap reports the reload (or its refusal).
func (s *Stack) ReloadPolicy(ctx context.Context, policy []byte) error {
	count := func() int {
		out := s.Capsnap.Output()
		return strings.Count(out, `"message":"policy reloaded"`) + strings.Count(out, "policy reload refused")
	}
	// Counted before the write: capsnap's file poller may see the change
	// before the signal does, and only one of them then reports it.
	before := count()
	if err := os.WriteFile(filepath.Join(s.opts.Dir, "policy.yaml"), policy, 0o600); err != nil {
		return fmt.Errorf("reload policy: %w", err)
	}
	if err := s.Capsnap.Signal(syscall.SIGHUP); err != nil {
		return fmt.Errorf("reload policy: %w", err)
	}
	for count() == before {
		select {
		case <-ctx.Done():
			return fmt.Errorf("reload policy: capsnap did not report the reload: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// CatalogTool is one tool of capsnap's view of a server, from GET /catalog.
type CatalogTool struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
}

// CatalogServer is capsnap's view of one server, from GET /catalog.
type CatalogServer struct {
	LastError string        `json:"last_error"`
	Tools     []CatalogTool `json:"tools"`
}

// waitCatalog polls capsnap's GET /catalog until done says so of server
// id's view, or ctx ends; what describes the wait in the error.
func (s *Stack) waitCatalog(ctx context.Context, id, what string, done func(CatalogServer) bool) error {
	for {
		var view map[string]CatalogServer
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.AdminURL()+"/catalog", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&view)
			resp.Body.Close()
		}
		if done(view[id]) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for capsnap to see %s %s: %w", id, what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// WaitCatalogError waits until capsnap reports that its view of server id
// is failing to refresh.
func (s *Stack) WaitCatalogError(ctx context.Context, id string) error {
	return s.waitCatalog(ctx, id, "failing", func(v CatalogServer) bool { return v.LastError != "" })
}

// WaitCatalog waits until capsnap's own view of server id shows tool with
// digest ("" waits for the tool to be gone).
func (s *Stack) WaitCatalog(ctx context.Context, id, tool, digest string) error {
	return s.waitCatalog(ctx, id, fmt.Sprintf("%s at %q", tool, digest), func(v CatalogServer) bool {
		found := ""
		for _, t := range v.Tools {
			if t.Name == tool {
				found = t.Digest
			}
		}
		return found == digest
	})
}
