//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/testbed"
)

// deployVersion is the MCP version the deployment tests speak: the
// current one. The access log names the MCP method and tool from capsnap's
// metadata in every version (TestAccessLogNamesMCPRequests).
const deployVersion = "2026-07-28"

// creds are one test's credentials: the PKI that issues Envoy's server
// certificate and the agents' SVIDs, and the issuer of their tokens.
type creds struct {
	pki    *testbed.PKI
	issuer *testbed.Issuer
}

func newCreds(t *testing.T) creds {
	t.Helper()
	pki, err := testbed.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	iss, err := testbed.NewIssuer("agents-1")
	if err != nil {
		t.Fatal(err)
	}
	return creds{pki, iss}
}

// A deployment is one of envoy/*.yaml that takes the principal from a
// credential Envoy verified, run for real.
type deployment struct {
	name string
	// principal is capsnap's principal section for this deployment, as a
	// YAML flow mapping.
	principal func(t *testing.T) string
	// policy, if set, is the policy file this deployment runs, in place
	// of testdata/policy.yaml.
	policy string
	// logColumn is the access log's column that names the principal
	// Envoy verified.
	logColumn string
	// grpcTLS, if set, is capsnap's grpc_tls section for this deployment.
	grpcTLS func(creds) string
	// config renders the Envoy YAML for a stack on ports.
	config func(testbed.Ports, creds) ([]byte, error)
	// as is the HTTP side of an agent that proves it is principal.
	as func(t *testing.T, c creds, principal string) *agentTransport
	// refused are requests Envoy must refuse without asking capsnap.
	refused func(t *testing.T, c creds) []refusal
}

// A refusal is a request with a credential Envoy must not accept.
type refusal struct {
	name  string
	agent *agentTransport
	// status is Envoy's answer; 0 means the TLS handshake fails.
	status int
	// reason, if set, is capsnap's denial: Envoy lets the request through
	// (status is then capsnap's), and capsnap refuses it.
	reason string
}

var deployments = []deployment{
	{
		name:      "mtls",
		principal: func(*testing.T) string { return "{source: mtls}" },
		logColumn: "peer",
		grpcTLS:   func(c creds) string { return testbed.CapsnapTLS(c.pki, "") },
		config: func(p testbed.Ports, c creds) ([]byte, error) {
			return testbed.MTLSEnvoyConfig(p, c.pki), nil
		},
		as: func(t *testing.T, c creds, principal string) *agentTransport {
			return newAgentTransport(c.pki.ClientTLS(clientCert(t, c.pki, principal)), nil)
		},
		refused: func(t *testing.T, c creds) []refusal {
			rogue, err := testbed.NewPKI(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return []refusal{
				{"no certificate", newAgentTransport(c.pki.ClientTLS(), nil), 0, ""},
				{"certificate from another CA", newAgentTransport(c.pki.ClientTLS(clientCert(t, rogue, supportAgent)), nil), 0, ""},
				{"SPIFFE ID of another trust domain", newAgentTransport(c.pki.ClientTLS(clientCert(t, c.pki, "spiffe://evil/agent/support-refund")), nil), 0, ""},
				{"SPIFFE ID that is not an agent", newAgentTransport(c.pki.ClientTLS(clientCert(t, c.pki, "spiffe://acme/service/billing")), nil), 0, ""},
			}
		},
	},
	{
		// examples/jwt as shipped: its principal section and its policy.
		name:      "jwt",
		principal: func(t *testing.T) string { return principalOf(t, "../examples/jwt/capsnap.yaml") },
		policy:    "../examples/jwt/policy.yaml",
		logColumn: "subject",
		config: func(p testbed.Ports, c creds) ([]byte, error) {
			return testbed.JWTEnvoyConfig(p, c.pki, c.issuer)
		},
		as: func(t *testing.T, c creds, principal string) *agentTransport {
			return bearer(t, c, c.issuer, testbed.Claims(principal))
		},
		refused: jwtRefused(http.StatusUnauthorized, ""),
	},
	{
		// examples/istio/jwt's sidecar filter in place of envoy/jwt.yaml's
		// jwt_authn: a token that fails is refused as there, a request
		// without one reaches capsnap, which denies it.
		name:      "istio-jwt",
		principal: func(t *testing.T) string { return principalOf(t, "../examples/jwt/capsnap.yaml") },
		policy:    "../examples/jwt/policy.yaml",
		logColumn: "subject",
		config:    sidecarJWTConfig,
		as: func(t *testing.T, c creds, principal string) *agentTransport {
			return bearer(t, c, c.issuer, testbed.Claims(principal))
		},
		refused: jwtRefused(http.StatusOK, "no_principal"),
	},
}

// jwtRefused are the tokens jwt_authn must refuse, and a request with
// none, which gets noToken from Envoy and, if reason is set, capsnap's
// denial.
func jwtRefused(noToken int, reason string) func(t *testing.T, c creds) []refusal {
	return func(t *testing.T, c creds) []refusal {
		forger, err := testbed.NewIssuer("agents-1") // the trusted kid, another key
		if err != nil {
			t.Fatal(err)
		}
		claims := func(edit func(jwt.MapClaims)) jwt.MapClaims {
			m := testbed.Claims(supportAgent)
			edit(m)
			return m
		}
		return []refusal{
			{"no token", newAgentTransport(c.pki.ClientTLS(), nil), noToken, reason},
			{"expired", bearer(t, c, c.issuer, claims(func(m jwt.MapClaims) {
				m["iat"], m["exp"] = time.Now().Add(-20*time.Minute).Unix(), time.Now().Add(-10*time.Minute).Unix()
			})), http.StatusUnauthorized, ""},
			{"no expiry", bearer(t, c, c.issuer, claims(func(m jwt.MapClaims) { delete(m, "exp") })), http.StatusUnauthorized, ""},
			{"lives over an hour", bearer(t, c, c.issuer, claims(func(m jwt.MapClaims) { m["exp"] = time.Now().Add(2 * time.Hour).Unix() })), http.StatusUnauthorized, ""},
			{"bad signature", bearer(t, c, forger, testbed.Claims(supportAgent)), http.StatusUnauthorized, ""},
			{"wrong issuer", bearer(t, c, c.issuer, claims(func(m jwt.MapClaims) { m["iss"] = "https://idp.evil.example" })), http.StatusUnauthorized, ""},
			{"wrong audience", bearer(t, c, c.issuer, claims(func(m jwt.MapClaims) { m["aud"] = "https://other.acme.example" })), http.StatusForbidden, ""},
			{"subject that is not an agent", bearer(t, c, c.issuer, claims(func(m jwt.MapClaims) { m["sub"] = "spiffe://acme/service/billing" })), http.StatusUnauthorized, ""},
		}
	}
}

// sidecarJWTConfig is envoy/jwt.yaml with its jwt_authn filter replaced by
// the one examples/istio/jwt inserts into each MCP server's sidecar, its
// inline keys by c's issuer's. The ext_authz filter already passes the
// payload's namespace, which the example merges into Istio's.
func sidecarJWTConfig(p testbed.Ports, c creds) ([]byte, error) {
	cfg, err := testbed.JWTEnvoyConfig(p, c.pki, c.issuer)
	if err != nil {
		return nil, err
	}
	patches, err := os.ReadFile("../examples/istio/jwt/jwt-authn.yaml")
	if err != nil {
		return nil, err
	}
	var ef struct {
		Spec struct {
			ConfigPatches []struct {
				Patch struct {
					Operation string         `yaml:"operation"`
					Value     map[string]any `yaml:"value"`
				} `yaml:"patch"`
			} `yaml:"configPatches"`
		} `yaml:"spec"`
	}
	if err := yaml.NewDecoder(bytes.NewReader(patches)).Decode(&ef); err != nil {
		return nil, err
	}
	var sidecar map[string]any
	for _, cp := range ef.Spec.ConfigPatches {
		if cp.Patch.Operation == "INSERT_BEFORE" {
			sidecar = cp.Patch.Value
		}
	}
	jwks, err := c.issuer.JWKS()
	if err != nil {
		return nil, err
	}
	keys := sidecar
	for _, k := range []string{"typed_config", "providers", "agents", "local_jwks"} {
		keys, _ = keys[k].(map[string]any)
	}
	if keys == nil {
		return nil, errors.New("examples/istio/jwt: no inserted filter with provider agents' local_jwks")
	}
	keys["inline_string"] = string(jwks)
	filter, err := json.Marshal(sidecar) // JSON is YAML: one list item
	if err != nil {
		return nil, err
	}
	const item = "          - name: "
	from := bytes.Index(cfg, []byte(item+"envoy.filters.http.jwt_authn\n"))
	to := bytes.Index(cfg, []byte(item+"envoy.filters.http.ext_authz\n"))
	if from < 0 || to < from {
		return nil, errors.New("envoy/jwt.yaml: the jwt_authn filter is not where expected, right before ext_authz")
	}
	return slices.Concat(cfg[:from], []byte("          - "), filter, []byte("\n"), cfg[to:]), nil
}

// Each deployment configuration, run by the real Envoy: the principal comes
// from the credential Envoy verified, each route holds a call to its own
// server, a credential Envoy refuses never reaches capsnap, and the access
// log carries capsnap's decision.
func TestDeployments(t *testing.T) {
	for _, d := range deployments {
		t.Run(d.name, func(t *testing.T) {
			c := newCreds(t)
			s := startStackWith(t, func(o *testbed.StackOptions) {
				cfg, err := d.config(o.Ports, c)
				if err != nil {
					t.Fatal(err)
				}
				o.EnvoyYAML, o.Principal = cfg, d.principal(t)
				if d.policy != "" {
					if o.Policy, err = os.ReadFile(d.policy); err != nil {
						t.Fatal(err)
					}
				}
				if d.grpcTLS != nil {
					o.GRPCTLS = d.grpcTLS(c)
				}
			})
			support, readonly := d.as(t, c, supportAgent), d.as(t, c, readonlyAgent)

			// Both routes behind the one listener: each call is held to its
			// own server's contract (payments' refund takes cents and a
			// destination account), and each server's handler re-verifies
			// the digest capsnap pinned for it.
			t.Run("each route its own server", func(t *testing.T) {
				for _, tt := range []struct {
					server string
					args   map[string]any
				}{
					{"billing", refundA100},
					{"payments", swapArgs},
				} {
					before := map[string]int{}
					for _, id := range testbed.Servers {
						before[id] = starts(t, s, id, "refund")
					}
					cs := support.connect(t, s.TLSRouteURL(tt.server))
					listTools(t, cs, "refund")
					if r := callTool(t, cs, "refund", tt.args); r != "" {
						t.Fatalf("%s refund: denied %s", tt.server, r)
					}
					for _, id := range testbed.Servers {
						want := before[id]
						if id == tt.server {
							want++
						}
						if got := starts(t, s, id, "refund"); got != want {
							t.Fatalf("a refund on /%s/ started %s's handler %d times, want %d", tt.server, id, got-before[id], want-before[id])
						}
					}
				}
			})

			t.Run("not granted", func(t *testing.T) {
				cs := readonly.connect(t, s.TLSRouteURL("billing"))
				listTools(t, cs, "lookup_order")
				before := starts(t, s, "billing", "refund")
				if r := callTool(t, cs, "refund", refundA100); r != "tool_not_granted" {
					t.Fatalf("read-only agent's refund: %q, want tool_not_granted", r)
				}
				if starts(t, s, "billing", "refund") != before {
					t.Fatal("a denied refund started its handler")
				}
			})

			// The development header names the support agent, but this
			// deployment's capsnap reads only the verified credential.
			t.Run("development header names no one", func(t *testing.T) {
				spoof := d.as(t, c, readonlyAgent)
				spoof.header.Set(testbed.PrincipalHeader, supportAgent)
				cs := spoof.connect(t, s.TLSRouteURL("billing"))
				listTools(t, cs, "lookup_order")
				if r := callTool(t, cs, "refund", refundA100); r != "tool_not_granted" {
					t.Fatalf("refund with a spoofed header: %q, want tool_not_granted", r)
				}
				_, call := waitDecision(t, s, func(l auditLine) bool {
					return l.Method == "tools/call" && l.Epoch == spoof.lastEpoch()
				})
				if call.Principal != readonlyAgent {
					t.Fatalf("capsnap decided the call as %q, want %q", call.Principal, readonlyAgent)
				}
			})

			// Refused by Envoy, or, where the deployment lets a request
			// through, by capsnap.
			t.Run("refused", func(t *testing.T) {
				for _, r := range d.refused(t, c) {
					t.Run(r.name, func(t *testing.T) {
						before := starts(t, s, "billing", "refund")
						from := mark(t, s, support)
						if r.status == 0 {
							alert := r.agent.handshake(t, s.EnvoyAddr())
							t.Logf("Envoy refused the handshake: %v", alert)
						}
						resp, err := r.agent.postRefund(t, s.TLSRouteURL("billing"))
						switch {
						case r.status == 0 && err == nil:
							t.Fatalf("Envoy answered %s, want a failed TLS handshake", resp.Status)
						case r.status != 0 && err != nil:
							t.Fatal(err)
						case r.status != 0 && resp.StatusCode != r.status:
							t.Fatalf("Envoy answered %s, want %d", resp.Status, r.status)
						}
						if starts(t, s, "billing", "refund") != before {
							t.Fatal("a refused request started the refund handler")
						}
						// Had capsnap decided the refused tools/call, its audit
						// line would be between the two marks.
						to := mark(t, s, support)
						decided := 0
						for _, l := range decisions(t, s)[from+1 : to] {
							if l.Method != "tools/call" {
								continue
							}
							decided++
							if r.reason == "" || l.Reason != r.reason {
								t.Fatalf("capsnap decided %+v, want %s", l, cmp.Or(r.reason, "no decision: Envoy refuses it"))
							}
						}
						if r.reason != "" && decided != 1 {
							t.Fatalf("capsnap decided the request %d times, want once (%s)", decided, r.reason)
						}
					})
				}
			})

			// Last: it stops Envoy, which flushes its access log.
			t.Run("access log carries the decision", func(t *testing.T) {
				allowed := support.connect(t, s.TLSRouteURL("billing"))
				listTools(t, allowed, "refund")
				if r := callTool(t, allowed, "refund", refundA100); r != "" {
					t.Fatalf("refund denied: %s", r)
				}
				denied := readonly.connect(t, s.TLSRouteURL("billing"))
				listTools(t, denied, "lookup_order")
				if r := callTool(t, denied, "refund", refundA100); r != "tool_not_granted" {
					t.Fatalf("read-only refund: %q, want tool_not_granted", r)
				}
				// Each row names the agent as Envoy verified it, and
				// capsnap decided the call as that principal.
				checkAccessLog(t, s, []logWant{
					{http.StatusOK, "allow", "ok", support.lastEpoch(), d.logColumn, supportAgent},
					{http.StatusOK, "deny", "tool_not_granted", readonly.lastEpoch(), d.logColumn, readonlyAgent},
				})
			})
		})
	}
}

// principalOf is the principal section of the capsnap configuration at
// path, as a YAML flow mapping (JSON).
func principalOf(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Principal map[string]any `yaml:"principal"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil || cfg.Principal == nil {
		t.Fatalf("%s: no principal section (%v)", path, err)
	}
	js, err := json.Marshal(cfg.Principal)
	if err != nil {
		t.Fatal(err)
	}
	return string(js)
}

// demo.yaml carries the same access log as the deployment configurations,
// and its rows carry capsnap's pins, never the ones a client forges.
func TestDemoAccessLog(t *testing.T) {
	s := startStack(t)
	// Not the schema digest: a client may send the one it planned
	// against, and capsnap holds the call to it.
	forge := func(a *testbed.Agent) {
		for _, h := range []string{"x-capsnap-server-id", "x-capsnap-tool", "x-capsnap-policy-digest"} {
			a.Send(h, "forged")
		}
	}
	support := connect(t, s, "billing", supportAgent, deployVersion)
	forge(support.agent)
	support.list(t)
	if r := support.call(t, "refund", refundA100); r != "" {
		t.Fatalf("refund denied: %s", r)
	}
	readonly := connect(t, s, "billing", readonlyAgent, deployVersion)
	forge(readonly.agent)
	readonly.list(t)
	if r := readonly.call(t, "refund", refundA100); r != "tool_not_granted" {
		t.Fatalf("read-only refund: %q, want tool_not_granted", r)
	}
	// A header name a server could fold into x-capsnap-tool is refused.
	req, err := http.NewRequest(http.MethodPost, s.RouteURL("billing"), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header["x_capsnap_tool"] = []string{"forged"}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("accept", "application/json, text/event-stream")
	resp, err := support.agent.HTTPClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a request with header x_capsnap_tool: %s, want 400", resp.Status)
	}
	checkAccessLog(t, s, []logWant{
		{status: http.StatusOK, decision: "allow", reason: "ok", epoch: support.agent.Epoch()},
		{status: http.StatusOK, decision: "deny", reason: "tool_not_granted", epoch: readonly.agent.Epoch()},
	})
}

// Every configuration in envoy/ is accepted by the real Envoy, rendered as
// a deployment would render it, and so is every variant the files and the
// examples document: envoy/jwt.yaml with the issuer's keys fetched
// (remote_jwks), and the gateway of examples/kubernetes/jwt.
func TestEnvoyConfigsValidate(t *testing.T) {
	envoyBin, err := testbed.FindEnvoy()
	if err != nil {
		t.Fatal(err)
	}
	c := newCreds(t)
	render := map[string]func(testbed.Ports, creds) ([]byte, error){
		"demo.yaml": func(p testbed.Ports, _ creds) ([]byte, error) { return testbed.EnvoyConfig(p), nil },
	}
	for _, d := range deployments {
		render[d.name+".yaml"] = d.config
	}
	files, err := filepath.Glob("../envoy/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Envoy configurations in ../envoy (%v)", err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			r, ok := render[name]
			if !ok {
				t.Fatalf("no renderer for %s: add it to this test", name)
			}
			cfg, err := r(testbed.DemoPorts, c)
			if err != nil {
				t.Fatal(err)
			}
			validateEnvoy(t, envoyBin, name, cfg)
		})
	}
	t.Run("jwt.yaml with remote_jwks", func(t *testing.T) {
		cfg, err := testbed.JWTEnvoyConfig(testbed.DemoPorts, c.pki, c.issuer)
		if err != nil {
			t.Fatal(err)
		}
		if cfg, err = testbed.RemoteJWKS(cfg); err != nil {
			t.Fatal(err)
		}
		validateEnvoy(t, envoyBin, "jwt-remote.yaml", cfg)
	})
	t.Run("examples/kubernetes/jwt", func(t *testing.T) {
		data, err := os.ReadFile("../examples/kubernetes/jwt/envoy-config.yaml")
		if err != nil {
			t.Fatal(err)
		}
		var cm struct {
			Data map[string]string `yaml:"data"`
		}
		if err := yaml.Unmarshal(data, &cm); err != nil || cm.Data["envoy.yaml"] == "" {
			t.Fatalf("the gateway's ConfigMap has no envoy.yaml (%v)", err)
		}
		r, err := testbed.JWTFiles(c.pki, c.issuer)
		if err != nil {
			t.Fatal(err)
		}
		validateEnvoy(t, envoyBin, "gateway.yaml", []byte(r.Replace(cm.Data["envoy.yaml"])))
	})
}

// validateEnvoy runs cfg through envoy --mode validate.
func validateEnvoy(t *testing.T, envoyBin, name string, cfg []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, envoyBin, "--mode", "validate", "-c", path).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("envoy --mode validate: %v\n%s", err, out)
	}
}

// agentTransport is an agent runtime's HTTP side in a deployment: TLS to
// Envoy (with the agent's certificate under mTLS), the headers it sends on
// every request (its bearer token under JWT), and the epoch capsnap
// returned on its last tools/list.
type agentTransport struct {
	base   *http.Transport
	header http.Header

	mu    sync.Mutex
	epoch string
}

func newAgentTransport(cfg *tls.Config, header http.Header) *agentTransport {
	if header == nil {
		header = http.Header{}
	}
	return &agentTransport{
		base:   &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true},
		header: header,
	}
}

// RoundTrip implements http.RoundTripper.
func (a *agentTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range a.header {
		r.Header[k] = v
	}
	resp, err := a.base.RoundTrip(r)
	if err == nil {
		if e := resp.Header.Get(testbed.EpochHeader); e != "" {
			a.mu.Lock()
			a.epoch = e
			a.mu.Unlock()
		}
	}
	return resp, err
}

func (a *agentTransport) lastEpoch() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.epoch
}

// opTimeout bounds each MCP operation and HTTP request of these tests.
const opTimeout = 10 * time.Second

// connect opens an MCP session to url on the official Go SDK.
func (a *agentTransport) connect(t *testing.T, url string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "capsnap-e2e", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: a}}, &mcp.ClientSessionOptions{ProtocolVersion: deployVersion})
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { cs.Close() })
	if got := cs.InitializeResult().ProtocolVersion; got != deployVersion {
		t.Fatalf("negotiated protocol version %s, want %s", got, deployVersion)
	}
	return cs
}

// handshake completes a TLS handshake with Envoy at addr and returns the
// alert Envoy answers it with; it fails the test if Envoy accepts the
// client. Under TLS 1.3 the client's side of the handshake completes before
// the server has checked the client's certificate, so the refusal is the
// first thing read.
func (a *agentTransport) handshake(t *testing.T, addr string) error {
	t.Helper()
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: opTimeout}, Config: a.base.TLSClientConfig}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		defer conn.Close()
		if err = conn.SetReadDeadline(time.Now().Add(opTimeout)); err != nil {
			t.Fatal(err)
		}
		_, err = conn.Read(make([]byte, 1))
	}
	var alert *net.OpError
	if !errors.As(err, &alert) || alert.Op != "remote error" {
		t.Fatalf("TLS to Envoy: %v, want Envoy to refuse the handshake with an alert", err)
	}
	return err
}

// postRefund sends one raw tools/call of billing's refund to url.
func (a *agentTransport) postRefund(t *testing.T, url string) (*http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund","arguments":{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}}}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := (&http.Client{Transport: a}).Do(req)
	if err == nil {
		resp.Body.Close()
	}
	return resp, err
}

func clientCert(t *testing.T, pki *testbed.PKI, spiffeID string) tls.Certificate {
	t.Helper()
	cert, err := pki.ClientCert(spiffeID)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// bearer is an agent that sends a token iss signed over claims, over TLS
// that trusts c's CA.
func bearer(t *testing.T, c creds, iss *testbed.Issuer, claims jwt.MapClaims) *agentTransport {
	t.Helper()
	tok, err := iss.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	return newAgentTransport(c.pki.ClientTLS(), http.Header{"Authorization": {"Bearer " + tok}})
}

// listTools lists tools and fails unless want is among them.
func listTools(t *testing.T, cs *mcp.ClientSession, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	if !slices.ContainsFunc(res.Tools, func(tool *mcp.Tool) bool { return tool.Name == want }) {
		t.Fatalf("tools/list has no %s", want)
	}
}

// callTool calls tool and returns capsnap's denial reason, or "" if allowed.
func callTool(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return denialReason(t, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error: %v", tool, res.Content)
	}
	return ""
}

// auditLine is the part of capsnap's audit line these tests read.
type auditLine struct {
	Decision  string `json:"decision"`
	Reason    string `json:"reason"`
	RequestID string `json:"request_id"`
	Principal string `json:"principal"`
	Method    string `json:"mcp_method"`
	Tool      string `json:"tool"`
	Epoch     string `json:"epoch"`
	Snapshot  string `json:"snapshot_digest"`
	Policy    string `json:"policy_digest"`
}

// decisions are capsnap's audit lines so far, in order.
func decisions(t *testing.T, s *testbed.Stack) []auditLine {
	t.Helper()
	var out []auditLine
	for _, line := range strings.Split(s.Capsnap.Output(), "\n") {
		var a auditLine
		if json.Unmarshal([]byte(line), &a) == nil && a.Decision != "" {
			out = append(out, a)
		}
	}
	return out
}

// waitDecision waits for capsnap's first audit line that ok accepts, and
// returns its index among the audit lines and the line. capsnap writes a
// line before Check returns, but it reaches us through a pipe.
func waitDecision(t *testing.T, s *testbed.Stack, ok func(auditLine) bool) (int, auditLine) {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for {
		a := decisions(t, s)
		if i := slices.IndexFunc(a, ok); i >= 0 {
			return i, a[i]
		}
		if time.Now().After(deadline) {
			t.Fatalf("capsnap's audit line did not arrive; last: %+v", a[max(0, len(a)-3):])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mark lists tools as agent, which capsnap decides, and returns the index
// of that decision's audit line: a point in capsnap's audit trail.
func mark(t *testing.T, s *testbed.Stack, agent *agentTransport) int {
	t.Helper()
	listTools(t, agent.connect(t, s.TLSRouteURL("billing")), "refund")
	epoch := agent.lastEpoch()
	i, _ := waitDecision(t, s, func(l auditLine) bool { return l.Method == "tools/list" && l.Epoch == epoch })
	return i
}

// accessLine is one row of the access log envoy/*.yaml write to stdout.
type accessLine struct {
	RequestID    string  `json:"request_id"`
	MCPMethod    *string `json:"mcp_method"`
	MCPName      *string `json:"mcp_name"`
	ResponseCode int     `json:"response_code"`
	Decision     *string `json:"decision"`
	Reason       *string `json:"reason"`
	Epoch        *string `json:"epoch"`
	ServerID     *string `json:"server_id"`
	Tool         *string `json:"tool"`
	SchemaDigest *string `json:"schema_digest"`
	PolicyDigest *string `json:"policy_digest"`
	// columns are all of the row's columns, by name.
	columns map[string]any
}

// A logWant is a tools/call of billing's refund the access log must show.
type logWant struct {
	status           int
	decision, reason string
	epoch            string
	// column, if set, is the row's column that must name principal, as
	// capsnap's audit line does.
	column, principal string
}

// checkAccessLog stops Envoy, so that it flushes its access log, and
// checks that each wanted refund call has a row carrying capsnap's decision,
// reason and epoch, which joins by request_id to capsnap's audit line for
// the same decision.
func checkAccessLog(t *testing.T, s *testbed.Stack, wants []logWant) {
	t.Helper()
	if err := s.Envoy.Stop(); err != nil {
		t.Fatalf("stop envoy: %v", err)
	}
	var rows []accessLine
	sc := bufio.NewScanner(strings.NewReader(s.Envoy.Output()))
	for sc.Scan() {
		// TestDemoAccessLog's agents forge pin headers "forged": no row
		// may carry one.
		if bytes.Contains(sc.Bytes(), []byte(`"forged"`)) {
			t.Errorf("an access log row carries a forged pin: %s", sc.Bytes())
		}
		var row accessLine
		if json.Unmarshal(sc.Bytes(), &row) == nil && json.Unmarshal(sc.Bytes(), &row.columns) == nil && row.RequestID != "" {
			rows = append(rows, row)
		}
	}
	audit := map[string]auditLine{}
	for _, a := range decisions(t, s) {
		audit[a.RequestID] = a
	}
	str := func(p *string) string {
		if p == nil {
			return "<null>"
		}
		return *p
	}
	for _, w := range wants {
		if w.epoch == "" {
			t.Fatalf("no epoch for the %s call: its tools/list returned none", w.reason)
		}
		found := false
		for _, r := range rows {
			if str(r.Tool) != "refund" || str(r.Epoch) != w.epoch || str(r.MCPMethod) != "tools/call" {
				continue
			}
			found = true
			if r.ResponseCode != w.status || str(r.Decision) != w.decision || str(r.Reason) != w.reason || str(r.ServerID) != "billing" || str(r.MCPName) != "refund" {
				t.Errorf("access log row %+v: want %d %s %s on billing, naming refund", r, w.status, w.decision, w.reason)
			}
			a := audit[r.RequestID]
			if a.Decision != w.decision || a.Reason != w.reason || a.Epoch != w.epoch {
				t.Errorf("request %s: access log says %s %s under %s, capsnap's audit line %+v", r.RequestID, w.decision, w.reason, w.epoch, a)
			}
			// An allowed row's pins come from the headers capsnap set for
			// the upstream (header_to_metadata), a denied row's from
			// capsnap's metadata: either way, what capsnap decided on.
			if w.decision == "allow" && (!strings.HasPrefix(a.Snapshot, "sha256:") || !strings.HasPrefix(a.Policy, "sha256:")) {
				t.Errorf("request %s: capsnap's audit line names no digests: %+v", r.RequestID, a)
			}
			if w.column != "" && (r.columns[w.column] != w.principal || a.Principal != w.principal) {
				t.Errorf("request %s: access log %s %v, capsnap decided as %q; want both %q", r.RequestID, w.column, r.columns[w.column], a.Principal, w.principal)
			}
			if (a.Snapshot != "" && str(r.SchemaDigest) != a.Snapshot) || (a.Policy != "" && str(r.PolicyDigest) != a.Policy) {
				t.Errorf("request %s: access log row has schema digest %s, policy digest %s; capsnap decided on %s, %s", r.RequestID, str(r.SchemaDigest), str(r.PolicyDigest), a.Snapshot, a.Policy)
			}
		}
		if !found {
			t.Errorf("no access log row for the refund call under %s (%s); rows:\n%+v", w.epoch, w.reason, rows)
		}
	}
}
