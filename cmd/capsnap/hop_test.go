package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/testbed"
)

// adminRig is capsnap's real admin mux over a real decision server (on
// testdata/ok.yaml), behind the hop's guard, served over HTTP.
type adminRig struct {
	url       string
	tokenFile string
	logs      *testbed.SyncBuffer
}

func newAdminRig(t *testing.T, tokenFile string) *adminRig {
	t.Helper()
	cfg, err := config.Load("testdata/ok.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := decide.LoadRules(cfg.PolicyFile)
	if err != nil {
		t.Fatal(err)
	}
	srcs, err := sources(cfg, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cat := catalog.New(srcs, catalog.Options{Logger: zerolog.Nop()})
	store, err := store.NewMemory(store.MemoryOptions{MaxSnapshots: 10, Retain: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	srv, err := decide.New(decide.Options{Catalog: cat, Servers: cat.Servers(), Rules: rules, Snapshots: store,
		SnapshotTTL: time.Minute, Freshness: cfg.Catalog})
	if err != nil {
		t.Fatal(err)
	}
	logs := &testbed.SyncBuffer{}
	log := zerolog.New(logs)
	cfg.Admin.TokenFile = tokenFile
	h, err := newHop(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	mux := adminMux(cat, prometheus.NewRegistry(), srv, cfg.PolicyFile, true, log)
	serveBudgets(mux, srv, log)
	ts := httptest.NewServer(h.guardAdmin(mux))
	t.Cleanup(ts.Close)
	return &adminRig{url: ts.URL, tokenFile: tokenFile, logs: logs}
}

func (r *adminRig) do(t *testing.T, method, path, authorization string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, r.url+path, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	// No redirects followed: an unclean path must not reach a handler by
	// any route.
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// reloads counts the policy reloads the admin endpoint ran.
func (r *adminRig) reloads() int { return strings.Count(r.logs.String(), "policy reload requested") }

func writeToken(t *testing.T, path, token string) {
	t.Helper()
	if err := testbed.ReplaceFile(path, []byte(token+"\n")); err != nil {
		t.Fatal(err)
	}
}

// With admin.token_file, every admin request that is not a GET, the
// profiles and the budgets need the token; the probes, metrics and catalog
// view do not.
func TestAdminToken(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin.token")
	token := strings.Repeat("a", 44)
	writeToken(t, tokenFile, token)
	r := newAdminRig(t, tokenFile)
	bearer := "Bearer " + token
	for _, tt := range []struct {
		name, method, path, auth string
		want                     int
		reloaded                 bool
	}{
		{"healthz needs no token", "GET", "/healthz", "", http.StatusOK, false},
		{"metrics needs no token", "GET", "/metrics", "", http.StatusOK, false},
		{"catalog needs no token", "GET", "/catalog", "", http.StatusOK, false},
		{"reload without a token", "POST", "/policy/reload", "", http.StatusUnauthorized, false},
		{"reload with a wrong token", "POST", "/policy/reload", "Bearer " + strings.Repeat("b", 44), http.StatusUnauthorized, false},
		{"reload with a prefix of the token", "POST", "/policy/reload", "Bearer " + token[:40], http.StatusUnauthorized, false},
		{"reload with the token as Basic", "POST", "/policy/reload", "Basic " + token, http.StatusUnauthorized, false},
		{"reload with the token", "POST", "/policy/reload", bearer, http.StatusOK, true},
		{"reload with the token, scheme in lower case", "POST", "/policy/reload?allow_loosening=true&by=alice&reason=INC-42", "bearer " + token, http.StatusOK, true},
		{"reload by an unclean path", "POST", "//policy/../policy/reload", "", http.StatusUnauthorized, false},
		{"another method on a GET endpoint", "DELETE", "/healthz", "", http.StatusUnauthorized, false},
		{"profiles without a token", "GET", "/debug/pprof/", "", http.StatusUnauthorized, false},
		{"profiles with the token", "GET", "/debug/pprof/cmdline", bearer, http.StatusOK, false},
		{"budgets without a token", "GET", "/budgets?principal=p&server=billing&tool=refund", "", http.StatusUnauthorized, false},
		{"budgets with the token", "GET", "/budgets?principal=spiffe://acme/agent/support-refund&server=billing&tool=refund", bearer, http.StatusOK, false},
		{"a budget reset without a token", "POST", "/budgets/reset?principal=p&server=billing&tool=refund&rule=r&by=b&reason=r", "", http.StatusUnauthorized, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := r.reloads()
			resp := r.do(t, tt.method, tt.path, tt.auth)
			if resp.StatusCode != tt.want {
				t.Fatalf("%s %s = %s, want %d", tt.method, tt.path, resp.Status, tt.want)
			}
			if tt.want == http.StatusUnauthorized && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without a WWW-Authenticate: Bearer challenge")
			}
			if got := r.reloads() - before; got != map[bool]int{true: 1}[tt.reloaded] {
				t.Fatalf("the request ran %d policy reloads", got)
			}
		})
	}
	if !strings.Contains(r.logs.String(), "admin request refused") || strings.Contains(r.logs.String(), token) {
		t.Errorf("refusals are not logged, or the token is:\n%s", r.logs)
	}

	t.Run("token rotated on disk", func(t *testing.T) {
		next := strings.Repeat("n", 44)
		writeToken(t, tokenFile, next)
		if resp := r.do(t, "POST", "/policy/reload", bearer); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("the old token after a rotation: %s", resp.Status)
		}
		if resp := r.do(t, "POST", "/policy/reload", "Bearer "+next); resp.StatusCode != http.StatusOK {
			t.Fatalf("the new token: %s", resp.Status)
		}
	})
	t.Run("token file gone", func(t *testing.T) {
		if err := os.Remove(tokenFile); err != nil {
			t.Fatal(err)
		}
		if resp := r.do(t, "POST", "/policy/reload", bearer); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("without a token file: %s, want 503", resp.Status)
		}
	})
}

// Without a token file (admin_addr on loopback), the admin endpoints are
// open, as before.
func TestAdminWithoutToken(t *testing.T) {
	r := newAdminRig(t, "")
	if resp := r.do(t, "POST", "/policy/reload", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /policy/reload = %s", resp.Status)
	}
	// Who and why go with a loosening, and only with one.
	for _, path := range []string{"/policy/reload?by=alice&reason=INC-42", "/policy/reload?allow_loosening=true&by=alice", "/policy/reload?allow_loosening=true&reason=INC-42"} {
		if resp := r.do(t, "POST", path, ""); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST %s = %s, want 400", path, resp.Status)
		}
	}
}

// capsnap policy reload sends the token, from --token-file or from
// capsnap's own configuration.
func TestPolicyReloadCommand(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin.token")
	writeToken(t, tokenFile, strings.Repeat("c", 44))
	r := newAdminRig(t, tokenFile)
	addr := strings.TrimPrefix(r.url, "http://")
	_, port, _ := net.SplitHostPort(addr)
	cfgFile := filepath.Join(dir, "capsnap.yaml")
	cfg := fmt.Sprintf("admin_addr: 0.0.0.0:%s\nadmin: {token_file: admin.token}\npolicy_file: policy.yaml\nservers:\n  - {id: billing, url: \"http://127.0.0.1:1/mcp\"}\n", port)
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		args   []string
		code   int
		output string
	}{
		{"without the token", []string{"--admin", addr}, exitFailure, "policy reload unauthorized: send Authorization: Bearer"},
		{"with --token-file", []string{"--admin", addr, "--token-file", tokenFile}, exitOK, "policy reload: unchanged"},
		{"with --config", []string{"--config", cfgFile, "--allow-loosening", "--by", "alice", "--reason", "INC-42"}, exitOK, "policy reload: unchanged"},
		{"with --config and another token file", []string{"--config", cfgFile, "--token-file", cfgFile}, exitFailure, "cannot go in a header"},
		{"loosening without --by", []string{"--config", cfgFile, "--allow-loosening", "--reason", "INC-42"}, exitUsage, "--allow-loosening needs --by and --reason"},
		{"loosening without --reason", []string{"--config", cfgFile, "--allow-loosening", "--by", "alice"}, exitUsage, "--allow-loosening needs --by and --reason"},
		{"--by without loosening", []string{"--config", cfgFile, "--by", "alice"}, exitUsage, "--by and --reason go with --allow-loosening"},
		{"a reason the API refuses", []string{"--config", cfgFile, "--allow-loosening", "--by", "alice", "--reason", "a\x1b[2J"}, exitFailure, "policy reload bad_request: reason holds a control character"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"policy", "reload"}, tt.args...), &stdout, &stderr)
			if code != tt.code || !strings.Contains(stdout.String()+stderr.String(), tt.output) {
				t.Fatalf("exit %d, want %d; output %q%q, want %q", code, tt.code, &stdout, &stderr, tt.output)
			}
		})
	}
}

func TestLoopbackIfUnspecified(t *testing.T) {
	for in, want := range map[string]string{
		"0.0.0.0:9002":   "127.0.0.1:9002",
		":9002":          "127.0.0.1:9002",
		"[::]:9002":      "[::1]:9002",
		"10.1.2.3:9002":  "10.1.2.3:9002",
		"127.0.0.1:9002": "127.0.0.1:9002",
		"capsnap:9002":   "capsnap:9002",
	} {
		if got := loopbackIfUnspecified(in); got != want {
			t.Errorf("loopbackIfUnspecified(%q) = %q, want %q", in, got, want)
		}
	}
}

// tlsConfig is a capsnap configuration whose grpc_tls uses pki's files.
func tlsConfig(t *testing.T, pki *testbed.PKI, extra string) string {
	t.Helper()
	policy, _ := filepath.Abs("testdata/policy.yaml")
	tools, _ := filepath.Abs("testdata/tools.json")
	path := filepath.Join(pki.Dir, "capsnap.yaml")
	cfg := fmt.Sprintf(`policy_file: %s
servers:
  - {id: billing, catalog_file: %s}
grpc_tls:
  cert_file: %s
  key_file: %s
  client_ca_file: %s
  allowed_clients: [%q]
%s
`, policy, tools, testbed.CapsnapCertFile, testbed.CapsnapKeyFile, testbed.CAFile, testbed.EnvoyIdentity, extra)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// capsnap check loads the TLS material and the admin token, as serve does.
func TestCheckLoadsAccessFiles(t *testing.T) {
	for _, tt := range []struct {
		name  string
		spoil func(t *testing.T, pki *testbed.PKI)
		extra string
		code  int
		want  string
	}{
		{"good", nil, "", exitOK, ": ok ("},
		{"key of another certificate", func(t *testing.T, pki *testbed.PKI) {
			b, err := os.ReadFile(filepath.Join(pki.Dir, testbed.ServerKeyFile))
			if err != nil {
				t.Fatal(err)
			}
			if err := testbed.ReplaceFile(filepath.Join(pki.Dir, testbed.CapsnapKeyFile), b); err != nil {
				t.Fatal(err)
			}
		}, "", exitFailure, "grpc_tls: mtls: "},
		{"no client CA bundle", func(t *testing.T, pki *testbed.PKI) {
			if err := os.Remove(filepath.Join(pki.Dir, testbed.CAFile)); err != nil {
				t.Fatal(err)
			}
		}, "", exitFailure, "grpc_tls: mtls: open"},
		{"short admin token", func(t *testing.T, pki *testbed.PKI) {
			writeToken(t, filepath.Join(pki.Dir, "admin.token"), "short")
		}, "admin: {token_file: admin.token}", exitFailure, "admin.token_file: "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pki, err := testbed.NewPKI(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			path := tlsConfig(t, pki, tt.extra)
			if tt.spoil != nil {
				tt.spoil(t, pki)
			}
			var stdout, stderr bytes.Buffer
			if code := run([]string{"check", "--config", path}, &stdout, &stderr); code != tt.code || !strings.Contains(stdout.String()+stderr.String(), tt.want) {
				t.Fatalf("exit %d, want %d; output %q%q, want %q", code, tt.code, &stdout, &stderr, tt.want)
			}
		})
	}
}

// grpc_tls on a real gRPC server: Envoy's identity is served, a client
// without a certificate or with one off the allowlist is refused at the
// handshake, and with max_connection_age an open connection comes to see
// a certificate rotated on disk.
func TestGRPCTLS(t *testing.T) {
	pki, err := testbed.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(tlsConfig(t, pki, "  reload_interval: 100ms\n  max_connection_age: 1s"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := newHop(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(h.grpcOptions()...)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.run(ctx); close(done) }()
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() { cancel(); gs.Stop(); <-done })

	client := func(t *testing.T, creds credentials.TransportCredentials) healthpb.HealthClient {
		t.Helper()
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return healthpb.NewHealthClient(conn)
	}
	tlsTo := func(certs ...tls.Certificate) credentials.TransportCredentials {
		return credentials.NewTLS(tlsConfigFor(pki, certs...))
	}
	check := func(hc healthpb.HealthClient) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var p peer.Peer
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
			return "", err
		}
		return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber.Text(16), nil
	}
	issue := func(id string) tls.Certificate {
		c, err := pki.ClientCert(id)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	envoy := client(t, tlsTo(issue(testbed.EnvoyIdentity)))
	first, err := check(envoy)
	if err != nil {
		t.Fatalf("Envoy's identity: %v", err)
	}
	if err := testbed.TLSRefusal(lis.Addr().String(), tlsConfigFor(pki, issue(testbed.EnvoyIdentity))); err != nil {
		t.Fatalf("a handshake as Envoy: %v", err)
	}
	for _, tt := range []struct {
		name  string
		certs []tls.Certificate
		alert string
	}{
		{"no certificate", nil, "certificate required"},
		{"certificate not on the allowlist", []tls.Certificate{issue("spiffe://acme/agent/support-refund")}, "bad certificate"},
		{"plaintext", nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			creds := tlsTo(tt.certs...)
			if tt.alert == "" {
				creds = insecure.NewCredentials()
			}
			// gRPC's client may see the connection closed before it reads
			// the alert; the handshake alone shows which it is.
			if _, err := check(client(t, creds)); status.Code(err) != codes.Unavailable {
				t.Fatalf("Check = %v; want Unavailable", err)
			}
			if tt.alert == "" {
				return
			}
			if err := testbed.TLSRefusal(lis.Addr().String(), tlsConfigFor(pki, tt.certs...)); !testbed.IsAlert(err, tt.alert) {
				t.Fatalf("handshake: %v; want the alert %q", err, tt.alert)
			}
		})
	}

	t.Run("rotation reaches an open connection", func(t *testing.T) {
		c, err := pki.ServerCert(testbed.CapsnapServerName)
		if err != nil {
			t.Fatal(err)
		}
		if err := testbed.WriteKeyPair(pki.Dir, c, testbed.CapsnapCertFile, testbed.CapsnapKeyFile); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			serial, err := check(envoy)
			if err != nil {
				t.Fatalf("Check on the open connection during the rotation: %v", err)
			}
			if serial != first {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the connection still shows the old certificate after max_connection_age")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// tlsConfigFor is a client of capsnap's gRPC listener that trusts pki and
// presents certs; it speaks HTTP/2, without which gRPC's server hangs up.
func tlsConfigFor(pki *testbed.PKI, certs ...tls.Certificate) *tls.Config {
	c := pki.ClientTLS(certs...)
	c.ServerName = testbed.CapsnapServerName
	c.NextProtos = []string{"h2"}
	return c
}
