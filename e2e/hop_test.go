//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/capsnap/capsnap/testbed"
)

// hopMaxAge is capsnap's grpc_tls.max_connection_age in these tests:
// short, so that Envoy handshakes again within them.
const hopMaxAge = time.Second

// hopRig is envoy/mtls.yaml's deployment run for real with capsnap's
// grpc_tls on: Envoy dials capsnap over mutual TLS with its own SVID. A
// second CA is trusted by both from the start (ca.pem holds both: the
// first step of a CA rotation), and capsnap has an admin token.
type hopRig struct {
	s          *testbed.Stack
	c          creds
	ca2        *testbed.PKI
	envoyAdmin string
	tokenFile  string
	support    *agentTransport
}

func newHopRig(t *testing.T) *hopRig {
	t.Helper()
	r := &hopRig{c: newCreds(t)}
	var err error
	if r.ca2, err = testbed.NewPKI(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := testbed.ReplaceFile(filepath.Join(r.c.pki.Dir, testbed.CAFile), r.bothCAs()); err != nil {
		t.Fatal(err)
	}
	r.tokenFile = filepath.Join(t.TempDir(), "admin.token")
	tok := make([]byte, 32)
	_, _ = rand.Read(tok)
	if err := os.WriteFile(r.tokenFile, []byte(base64.StdEncoding.EncodeToString(tok)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.s = startStackWith(t, func(o *testbed.StackOptions) {
		r.envoyAdmin = "127.0.0.1:" + strconv.Itoa(o.Ports.EnvoyAdmin)
		o.EnvoyYAML = testbed.MTLSEnvoyConfig(o.Ports, r.c.pki)
		o.Principal = "{source: mtls}"
		o.GRPCTLS = testbed.CapsnapTLS(r.c.pki, "reload_interval: 100ms, max_connection_age: "+hopMaxAge.String())
		o.AdminTokenFile = r.tokenFile
	})
	r.support = newAgentTransport(r.c.pki.ClientTLS(clientCert(t, r.c.pki, supportAgent)), nil)
	return r
}

func (r *hopRig) bothCAs() []byte { return append(r.c.pki.CAPEM(), r.ca2.CAPEM()...) }

// refund lists tools and calls billing's refund through Envoy as the
// support agent, which capsnap allows.
func (r *hopRig) refund(t *testing.T) {
	t.Helper()
	cs := r.support.connect(t, r.s.TLSRouteURL("billing"))
	listTools(t, cs, "refund")
	if reason := callTool(t, cs, "refund", refundA100); reason != "" {
		t.Fatalf("refund through Envoy: denied %s", reason)
	}
}

// envoyStat reads one counter of Envoy's.
func (r *hopRig) envoyStat(t *testing.T, name string) int {
	t.Helper()
	resp, err := http.Get("http://" + r.envoyAdmin + "/stats?filter=^" + strings.ReplaceAll(name, ".", `\.`) + "$")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+": "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("Envoy has no stat %s", name)
	return 0
}

// tlsTo is a client of capsnap's gRPC listener presenting certs, trusting
// both CAs.
func (r *hopRig) tlsTo(certs ...tls.Certificate) *tls.Config {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(r.bothCAs())
	return &tls.Config{RootCAs: roots, Certificates: certs, ServerName: testbed.CapsnapServerName,
		NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}
}

// envoyCert is a certificate with Envoy's identity from p.
func envoyCert(t *testing.T, p *testbed.PKI) tls.Certificate {
	return clientCert(t, p, testbed.EnvoyIdentity)
}

// served is the serial number of the certificate capsnap shows a new
// connection now.
func (r *hopRig) served(t *testing.T) string {
	t.Helper()
	conn, err := tls.Dial("tcp", r.s.GRPCAddr(), r.tlsTo(envoyCert(t, r.c.pki)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Text(16)
}

// checkDirect sends capsnap a Check straight over gRPC, bypassing Envoy,
// as a caller with cfg's TLS: a tools/list naming the support agent as
// the principal, under requestID. Allowed, it would mint a snapshot for
// that agent.
func (r *hopRig) checkDirect(t *testing.T, cfg *tls.Config, requestID string) error {
	t.Helper()
	conn, err := grpc.NewClient(r.s.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	_, err = authv3.NewAuthorizationClient(conn).Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Principal: supportAgent},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/billing/mcp",
			Headers: map[string]string{
				"content-type": "application/json", "accept": "application/json, text/event-stream",
				"x-request-id": requestID, "mcp-protocol-version": deployVersion,
			},
			RawBody: []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`),
		}},
		ContextExtensions: map[string]string{"server_id": "billing"},
	}})
	return err
}

// Envoy's Checks reach capsnap over mutual TLS; a caller without a
// certificate, or with one whose identity capsnap does not allow, is
// refused at the handshake and decides nothing; a rotated certificate and
// CA bundle are in force without a restart while Envoy keeps working; and
// the admin listener's policy reload needs the token.
func TestHop(t *testing.T) {
	r := newHopRig(t)
	pid := r.s.Capsnap.Pid()

	t.Run("Envoy's Checks over mutual TLS", func(t *testing.T) {
		r.refund(t)
		if n := r.envoyStat(t, "cluster.capsnap.ssl.handshake"); n == 0 {
			t.Fatal("Envoy made no TLS handshake with capsnap")
		}
		if n := r.envoyStat(t, "cluster.capsnap.ssl.connection_error"); n != 0 {
			t.Fatalf("Envoy counted %d TLS errors to capsnap", n)
		}
	})

	t.Run("refused at the handshake", func(t *testing.T) {
		rogue, err := testbed.NewPKI(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		dnsClient, err := r.c.pki.ClientCertDNS("envoy.mcp.svc.cluster.local")
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name  string
			cfg   *tls.Config
			alert string
		}{
			{"no certificate", r.tlsTo(), "certificate required"},
			{"an agent's certificate, not on the allowlist", r.tlsTo(clientCert(t, r.c.pki, supportAgent)), "bad certificate"},
			{"a DNS name not on the allowlist", r.tlsTo(dnsClient), "bad certificate"},
			{"Envoy's identity from another CA", r.tlsTo(envoyCert(t, rogue)), "unknown certificate authority"},
		}
		for i, tt := range cases {
			t.Run(tt.name, func(t *testing.T) {
				err := testbed.TLSRefusal(r.s.GRPCAddr(), tt.cfg)
				if !testbed.IsAlert(err, tt.alert) {
					t.Fatalf("handshake: %v; want capsnap's alert %q", err, tt.alert)
				}
				t.Logf("capsnap refused the handshake: %v", err)
				if err := r.checkDirect(t, tt.cfg, fmt.Sprintf("hop-refused-%d", i)); status.Code(err) != codes.Unavailable {
					t.Fatalf("Check: %v; want Unavailable", err)
				}
			})
		}
		// The same Check with Envoy's certificate is decided and audited:
		// had a refused one reached capsnap, its line would be there too.
		if err := r.checkDirect(t, r.tlsTo(envoyCert(t, r.c.pki)), "hop-admitted"); err != nil {
			t.Fatalf("Check with Envoy's certificate: %v", err)
		}
		waitDecision(t, r.s, func(l auditLine) bool { return l.RequestID == "hop-admitted" })
		for _, l := range decisions(t, r.s) {
			if strings.HasPrefix(l.RequestID, "hop-refused-") {
				t.Errorf("capsnap decided a Check it refused at the handshake: %+v", l)
			}
		}
		named := false
		for _, line := range strings.Split(r.s.Capsnap.Output(), "\n") {
			named = named || strings.Contains(line, "TLS client refused") && strings.Contains(line, supportAgent)
		}
		if !named {
			t.Errorf("capsnap did not log the identity it refused")
		}
	})

	t.Run("rotated certificate, Envoy working throughout", func(t *testing.T) {
		before := r.served(t)
		// The new certificate is the second CA's: a CA rotation's second
		// step, once every client trusts both.
		next, err := r.ca2.ServerCert(testbed.CapsnapServerName)
		if err != nil {
			t.Fatal(err)
		}
		if err := testbed.WriteKeyPair(r.c.pki.Dir, next, testbed.CapsnapCertFile, testbed.CapsnapKeyFile); err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(next.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		want := leaf.SerialNumber.Text(16)
		// Calls through Envoy go on while capsnap takes the new
		// certificate, and after, until Envoy's connection from before
		// the rotation has ended (max_connection_age) and it has
		// handshaken with the new one.
		deadline := time.Now().Add(opTimeout)
		for served := before; served != want; served = r.served(t) {
			if time.Now().After(deadline) {
				t.Fatalf("capsnap still serves %s, not the rotated %s", served, want)
			}
			r.refund(t)
			time.Sleep(100 * time.Millisecond)
		}
		// From here on capsnap shows every new connection the new
		// certificate alone.
		handshakes := r.envoyStat(t, "cluster.capsnap.ssl.handshake")
		for end := time.Now().Add(2 * hopMaxAge); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			r.refund(t)
		}
		if n := r.envoyStat(t, "cluster.capsnap.ssl.handshake"); n <= handshakes {
			t.Fatalf("Envoy made no handshake with capsnap's new certificate (%d handshakes, %d before)", n, handshakes)
		}
		if n := r.envoyStat(t, "cluster.capsnap.ssl.connection_error"); n != 0 {
			t.Fatalf("Envoy counted %d TLS errors to capsnap", n)
		}
		r.refund(t)
	})

	t.Run("bad certificate file keeps the one in force", func(t *testing.T) {
		before := r.served(t)
		certFile := filepath.Join(r.c.pki.Dir, testbed.CapsnapCertFile)
		good, err := os.ReadFile(certFile)
		if err != nil {
			t.Fatal(err)
		}
		if err := testbed.ReplaceFile(certFile, good[:len(good)/2]); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(opTimeout)
		for !strings.Contains(r.s.Capsnap.Output(), "does not load; keeping the material in force") {
			if time.Now().After(deadline) {
				t.Fatal("capsnap did not report the bad certificate file")
			}
			time.Sleep(50 * time.Millisecond)
		}
		// Past max_connection_age: Envoy has handshaken again, with the
		// certificate in force.
		for end := time.Now().Add(2 * hopMaxAge); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			r.refund(t)
		}
		if got := r.served(t); got != before {
			t.Fatalf("capsnap serves %s after a bad file, want %s still", got, before)
		}
		if err := testbed.ReplaceFile(certFile, good); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("client CA withdrawn, then restored", func(t *testing.T) {
		// capsnap's client CA bundle without the CA of Envoy's own
		// certificate: within max_connection_age Envoy's connection ends
		// and its next handshake is refused, so the agent's requests fail
		// closed (503).
		caFile := filepath.Join(r.c.pki.Dir, testbed.CAFile)
		if err := testbed.ReplaceFile(caFile, r.ca2.CAPEM()); err != nil {
			t.Fatal(err)
		}
		r.waitStatus(t, http.StatusServiceUnavailable)
		if err := testbed.ReplaceFile(caFile, r.bothCAs()); err != nil {
			t.Fatal(err)
		}
		r.waitStatus(t, http.StatusOK)
		r.refund(t)
	})

	if r.s.Capsnap.Exited() || r.s.Capsnap.Pid() != pid {
		t.Fatal("capsnap restarted during the test")
	}
	if n := strings.Count(r.s.Capsnap.Output(), "changed on disk: in force for new connections"); n < 3 {
		t.Errorf("capsnap reported %d reloads of its TLS material, want at least 3", n)
	}

	t.Run("policy reload needs the admin token", func(t *testing.T) {
		resp, err := http.Post(r.s.AdminURL()+"/policy/reload", "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("POST /policy/reload without the token: %s, want 401", resp.Status)
		}
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			resp, err := http.Get(r.s.AdminURL() + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("GET %s: %s, want 200 without a token", path, resp.Status)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		out, err := exec.CommandContext(ctx, bins["capsnap"], "policy", "reload", "--config", filepath.Join(r.s.Dir(), "capsnap.yaml")).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "policy reload: unchanged") {
			t.Fatalf("capsnap policy reload --config: %v\n%s", err, out)
		}
	})
}

// waitStatus posts a raw tools/call through Envoy until Envoy answers
// with want: 200 (capsnap decided it) or 503 (capsnap unreachable).
func (r *hopRig) waitStatus(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(3*hopMaxAge + opTimeout)
	for {
		resp, err := r.support.postRefund(t, r.s.TLSRouteURL("billing"))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Envoy still answers %s, want %d", resp.Status, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
