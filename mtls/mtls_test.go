package mtls

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/testbed"
)

// The identities the test server admits.
const (
	allowedSPIFFE = testbed.EnvoyIdentity
	allowedDNS    = "envoy.mcp.svc.cluster.local"
)

func TestParseIdentity(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Identity
		err  string
	}{
		{in: "spiffe://acme/gateway/mcp-envoy", want: Identity{SPIFFE: "spiffe://acme/gateway/mcp-envoy"}},
		{in: "spiffe://cluster.local/ns/mcp/sa/billing", want: Identity{SPIFFE: "spiffe://cluster.local/ns/mcp/sa/billing"}},
		{in: "dns:envoy.mcp.svc.cluster.local", want: Identity{DNS: "envoy.mcp.svc.cluster.local"}},
		{in: "dns:Envoy.MCP.svc", want: Identity{DNS: "envoy.mcp.svc"}},
		{in: "dns:localhost", want: Identity{DNS: "localhost"}},
		{in: "envoy", err: "neither spiffe://"},
		{in: "DNS:envoy", err: "neither spiffe://"},
		{in: "https://acme/gateway", err: "neither spiffe://"},
		{in: "spiffe://", err: "not a SPIFFE ID"},
		{in: "spiffe://acme", err: "names a trust domain"},
		{in: "spiffe://acme/", err: "names a trust domain"},
		{in: "spiffe://Acme/gateway", err: "not a SPIFFE ID"},
		{in: "spiffe://acme:443/gateway", err: "not a SPIFFE ID"},
		{in: "spiffe://user@acme/gateway", err: "not a SPIFFE ID"},
		{in: "spiffe://acme/gateway?x=1", err: "not a SPIFFE ID"},
		{in: "spiffe://acme/gateway?", err: "not a SPIFFE ID"},
		{in: "spiffe://acme/gateway#f", err: "not a SPIFFE ID"},
		{in: "spiffe://acme/gateway/", err: `path segment ""`},
		{in: "spiffe://acme/a//b", err: `path segment ""`},
		{in: "spiffe://acme/a/../b", err: `path segment ".."`},
		{in: "spiffe://acme/a%20b", err: "not a SPIFFE ID"},
		{in: "dns:", err: "is not a DNS name"},
		{in: "dns:*.mcp.svc", err: "is not a DNS name"},
		{in: "dns:envoy.mcp.svc.", err: "is not a DNS name"},
		{in: "dns:-envoy", err: "is not a DNS name"},
		{in: "dns:envoy mcp", err: "is not a DNS name"},
	} {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseIdentity(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseIdentity(%q) = %+v, %v; want an error containing %q", tt.in, got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseIdentity(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
		})
	}
}

// rig is a PKI, a Server on its files and a TLS listener that answers "ok"
// to every client the handshake admits.
type rig struct {
	pki  *testbed.PKI
	srv  *Server
	addr string
	opts Options
	logs *testbed.SyncBuffer
}

func newRig(t *testing.T) *rig {
	t.Helper()
	pki, err := testbed.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	logs := &testbed.SyncBuffer{}
	o := Options{
		CertFile:       filepath.Join(pki.Dir, testbed.CapsnapCertFile),
		KeyFile:        filepath.Join(pki.Dir, testbed.CapsnapKeyFile),
		ClientCAFile:   filepath.Join(pki.Dir, testbed.CAFile),
		Allowed:        []string{allowedSPIFFE, "dns:" + allowedDNS},
		ReloadInterval: time.Hour, // the tests call Reload, or Run with their own
		Logger:         zerolog.New(logs),
	}
	srv, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	tl := tls.NewListener(ln, srv.TLSConfig())
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if c.(*tls.Conn).Handshake() == nil {
					_, _ = c.Write([]byte("ok\n"))
				}
			}()
		}
	}()
	return &rig{pki: pki, srv: srv, addr: ln.Addr().String(), opts: o, logs: logs}
}

// dial handshakes as a client presenting certs (none: anonymous) and
// trusting roots (nil: the rig's CA), and returns the serial number of the
// server certificate it was shown, or the error that refused it. Under TLS
// 1.3 the client's side completes before the server has checked the
// client's certificate, so the server's refusal is what the first read
// returns.
func (r *rig) dial(t *testing.T, roots *x509.CertPool, certs ...tls.Certificate) (string, error) {
	t.Helper()
	if roots == nil {
		roots = r.pki.Pool
	}
	cfg := &tls.Config{RootCAs: roots, Certificates: certs, ServerName: testbed.CapsnapServerName, MinVersion: tls.VersionTLS12}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
	c, err := d.DialContext(context.Background(), "tcp", r.addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	if line != "ok\n" {
		t.Fatalf("server said %q", line)
	}
	return c.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.Text(16), nil
}

// refusedWith fails unless err is the server's TLS alert naming want.
func refusedWith(t *testing.T, err error, want string) {
	t.Helper()
	if !testbed.IsAlert(err, want) {
		t.Fatalf("got %v; want the server's alert %q", err, want)
	}
}

func issue(t *testing.T, p *testbed.PKI, edit func(*x509.Certificate)) tls.Certificate {
	t.Helper()
	c, err := p.Issue(edit)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func clientAuth(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth} }

func spiffe(ids ...string) func(*x509.Certificate) {
	return func(c *x509.Certificate) {
		clientAuth(c)
		for _, id := range ids {
			u, _ := url.Parse(id)
			c.URIs = append(c.URIs, u)
		}
	}
}

func dns(names ...string) func(*x509.Certificate) {
	return func(c *x509.Certificate) { clientAuth(c); c.DNSNames = names }
}

// Every client the handshake admits or refuses, and the alert a refused
// one gets.
func TestHandshake(t *testing.T) {
	r := newRig(t)
	rogue, err := testbed.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		certs []tls.Certificate
		// refused is the alert, "" if admitted.
		refused string
	}{
		{"allowed SPIFFE ID", []tls.Certificate{issue(t, r.pki, spiffe(allowedSPIFFE))}, ""},
		{"allowed DNS name", []tls.Certificate{issue(t, r.pki, dns(allowedDNS))}, ""},
		{"allowed DNS name in other letter case, among others", []tls.Certificate{issue(t, r.pki, dns("other.example", strings.ToUpper(allowedDNS)))}, ""},
		{"no certificate", nil, "certificate required"},
		{"SPIFFE ID not on the list", []tls.Certificate{issue(t, r.pki, spiffe("spiffe://acme/agent/support-refund"))}, "bad certificate"},
		{"SPIFFE ID extending an allowed one", []tls.Certificate{issue(t, r.pki, spiffe(allowedSPIFFE+"/evil"))}, "bad certificate"},
		{"SPIFFE ID of another trust domain", []tls.Certificate{issue(t, r.pki, spiffe(strings.Replace(allowedSPIFFE, "acme", "evil", 1)))}, "bad certificate"},
		{"two URI SANs, one allowed: not an SVID", []tls.Certificate{issue(t, r.pki, spiffe("spiffe://acme/agent/x", allowedSPIFFE))}, "bad certificate"},
		{"allowed SPIFFE ID as a DNS name", []tls.Certificate{issue(t, r.pki, dns("gateway.acme"))}, "bad certificate"},
		{"DNS name not on the list", []tls.Certificate{issue(t, r.pki, dns("billing.mcp.svc.cluster.local"))}, "bad certificate"},
		{"wildcard DNS name", []tls.Certificate{issue(t, r.pki, dns("*.mcp.svc.cluster.local"))}, "bad certificate"},
		{"allowed name in the subject only", []tls.Certificate{issue(t, r.pki, func(c *x509.Certificate) { clientAuth(c); c.Subject.CommonName = allowedDNS })}, "bad certificate"},
		{"allowed identity from another CA", []tls.Certificate{issue(t, rogue, spiffe(allowedSPIFFE))}, "unknown certificate authority"},
		{"allowed identity without client authentication usage", []tls.Certificate{issue(t, r.pki, func(c *x509.Certificate) {
			c.DNSNames = []string{allowedDNS}
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		})}, "bad certificate"},
		{"allowed identity, expired", []tls.Certificate{issue(t, r.pki, func(c *x509.Certificate) {
			spiffe(allowedSPIFFE)(c)
			c.NotBefore, c.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
		})}, "expired certificate"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := r.dial(t, nil, tt.certs...)
			if tt.refused == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			refusedWith(t, err, tt.refused)
		})
	}
	// A client refused for its identity is logged by name; one refused by
	// the chain check never reaches the allowlist.
	if logs := r.logs.String(); !strings.Contains(logs, "spiffe://acme/agent/support-refund") || !strings.Contains(logs, "TLS client refused") {
		t.Errorf("the refused identity is not in the log:\n%s", logs)
	}
}

// New content on disk is in force for the next handshake, and unchanged
// content is no reload.
func TestRotation(t *testing.T) {
	envoy := func(p *testbed.PKI) tls.Certificate { return issue(t, p, spiffe(allowedSPIFFE)) }
	ca2, err := testbed.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}

	t.Run("server certificate", func(t *testing.T) {
		r := newRig(t)
		before, err := r.dial(t, nil, envoy(r.pki))
		if err != nil {
			t.Fatal(err)
		}
		if changed, err := r.srv.Reload(); changed || err != nil {
			t.Fatalf("Reload of unchanged files = %v, %v", changed, err)
		}
		r.writeServerCert(t, r.pki)
		if changed, err := r.srv.Reload(); !changed || err != nil {
			t.Fatalf("Reload after a rotation = %v, %v", changed, err)
		}
		after, err := r.dial(t, nil, envoy(r.pki))
		if err != nil {
			t.Fatal(err)
		}
		if after == before {
			t.Fatalf("still shown serial %s after the rotation", before)
		}
		if serial, _ := r.srv.Current(); serial != after {
			t.Fatalf("Current() = %s, the handshake showed %s", serial, after)
		}
	})

	t.Run("server certificate from a new CA", func(t *testing.T) {
		r := newRig(t)
		r.writeServerCert(t, ca2)
		if _, err := r.srv.Reload(); err != nil {
			t.Fatal(err)
		}
		// A client that trusts only the old CA no longer trusts capsnap;
		// one that trusts the new one does, and is still admitted by the
		// client CA bundle, which did not change.
		if _, err := r.dial(t, nil, envoy(r.pki)); err == nil || !strings.Contains(err.Error(), "unknown authority") {
			t.Fatalf("a client trusting the old CA only: %v", err)
		}
		roots := ca2.Pool
		if _, err := r.dial(t, roots, envoy(r.pki)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("client CA bundle", func(t *testing.T) {
		r := newRig(t)
		// Both CAs while clients move from the old one to the new one.
		r.write(t, r.opts.ClientCAFile, append(r.pki.CAPEM(), ca2.CAPEM()...))
		if _, err := r.srv.Reload(); err != nil {
			t.Fatal(err)
		}
		for name, p := range map[string]*testbed.PKI{"old CA": r.pki, "new CA": ca2} {
			if _, err := r.dial(t, nil, envoy(p)); err != nil {
				t.Fatalf("client of the %s during the rotation: %v", name, err)
			}
		}
		// Then the new one alone: the old CA's clients are refused.
		r.write(t, r.opts.ClientCAFile, ca2.CAPEM())
		if _, err := r.srv.Reload(); err != nil {
			t.Fatal(err)
		}
		_, err := r.dial(t, nil, envoy(r.pki))
		refusedWith(t, err, "unknown certificate authority")
		if _, err := r.dial(t, nil, envoy(ca2)); err != nil {
			t.Fatalf("client of the new CA: %v", err)
		}
	})

	t.Run("picked up by Run", func(t *testing.T) {
		r := newRig(t)
		before, _ := r.srv.Current()
		// A server of its own that polls often.
		o := r.opts
		o.ReloadInterval = 10 * time.Millisecond
		srv, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { srv.Run(ctx); close(done) }()
		r.writeServerCert(t, r.pki)
		deadline := time.Now().Add(5 * time.Second)
		for serial, _ := srv.Current(); serial == before; serial, _ = srv.Current() {
			if time.Now().After(deadline) {
				t.Fatal("Run did not put the rotated certificate in force")
			}
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
	})
}

// Content that does not load leaves the last good material in force, is
// logged once, and good content after it is taken.
func TestBadContentKeepsTheMaterialInForce(t *testing.T) {
	other, err := testbed.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	otherKey, err := os.ReadFile(filepath.Join(other.Dir, testbed.CapsnapKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(other.Dir, testbed.ServerKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		// spoil spoils the rig's files.
		spoil func(t *testing.T, r *rig)
		err   string
	}{
		{"certificate file garbage", func(t *testing.T, r *rig) { r.write(t, r.opts.CertFile, []byte("not a certificate\n")) }, "failed to find any PEM data"},
		{"certificate file half written", func(t *testing.T, r *rig) {
			b := r.read(t, r.opts.CertFile)
			r.write(t, r.opts.CertFile, b[:len(b)/2])
		}, "failed to find any PEM data"},
		{"key of another certificate", func(t *testing.T, r *rig) { r.write(t, r.opts.KeyFile, otherKey) }, "does not match"},
		{"certificate file removed", func(t *testing.T, r *rig) {
			if err := os.Remove(r.opts.CertFile); err != nil {
				t.Fatal(err)
			}
		}, "no such file"},
		{"expired certificate", func(t *testing.T, r *rig) {
			c := issue(t, r.pki, func(c *x509.Certificate) {
				c.DNSNames = []string{testbed.CapsnapServerName}
				c.NotBefore, c.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
			})
			if err := testbed.WriteKeyPair(r.pki.Dir, c, testbed.CapsnapCertFile, testbed.CapsnapKeyFile); err != nil {
				t.Fatal(err)
			}
		}, "not now"},
		{"CA bundle empty", func(t *testing.T, r *rig) { r.write(t, r.opts.ClientCAFile, nil) }, "no PEM certificate"},
		{"CA bundle holds a key", func(t *testing.T, r *rig) {
			r.write(t, r.opts.ClientCAFile, append(r.pki.CAPEM(), keyPEM...))
		}, "PRIVATE KEY block"},
		{"CA bundle certificate garbled", func(t *testing.T, r *rig) {
			r.write(t, r.opts.ClientCAFile, []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
		}, "x509"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			envoy := issue(t, r.pki, spiffe(allowedSPIFFE))
			before, err := r.dial(t, nil, envoy)
			if err != nil {
				t.Fatal(err)
			}
			good := map[string][]byte{}
			for _, f := range []string{r.opts.CertFile, r.opts.KeyFile, r.opts.ClientCAFile} {
				good[f] = r.read(t, f)
			}
			tt.spoil(t, r)
			for range 2 {
				if changed, err := r.srv.Reload(); changed || err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Reload = %v, %v; want an error containing %q", changed, err, tt.err)
				}
			}
			if n := strings.Count(r.logs.String(), "does not load"); n != 1 {
				t.Errorf("the bad content was logged %d times, want once:\n%s", n, r.logs)
			}
			if serial, err := r.dial(t, nil, envoy); err != nil || serial != before {
				t.Fatalf("after bad content: serial %s, %v; want the material in force (serial %s)", serial, err, before)
			}
			// Good content again: a rotation done right.
			for f, b := range good {
				r.write(t, f, b)
			}
			r.writeServerCert(t, r.pki)
			if changed, err := r.srv.Reload(); !changed || err != nil {
				t.Fatalf("Reload of good content = %v, %v", changed, err)
			}
			if serial, err := r.dial(t, nil, envoy); err != nil || serial == before {
				t.Fatalf("after good content: serial %s, %v; want a new one", serial, err)
			}
		})
	}
}

func TestNewRefuses(t *testing.T) {
	r := newRig(t)
	for _, tt := range []struct {
		name string
		edit func(*Options)
		err  string
	}{
		{"no allowed clients", func(o *Options) { o.Allowed = nil }, "no allowed clients"},
		{"a bad entry", func(o *Options) { o.Allowed = []string{allowedSPIFFE, "envoy"} }, `allowed[1]: "envoy" is neither`},
		{"no reload interval", func(o *Options) { o.ReloadInterval = 0 }, "reload interval"},
		{"no certificate file", func(o *Options) { o.CertFile = filepath.Join(r.pki.Dir, "none.pem") }, "no such file"},
		{"key and certificate apart", func(o *Options) { o.KeyFile = filepath.Join(r.pki.Dir, testbed.ServerKeyFile) }, "does not match"},
		{"CA bundle that is a certificate's key", func(o *Options) { o.ClientCAFile = o.KeyFile }, "PRIVATE KEY block"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := r.opts
			tt.edit(&o)
			if _, err := New(o); err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("New = %v; want an error containing %q", err, tt.err)
			}
		})
	}
}

func (r *rig) writeServerCert(t *testing.T, p *testbed.PKI) {
	t.Helper()
	c, err := p.ServerCert(testbed.CapsnapServerName)
	if err != nil {
		t.Fatal(err)
	}
	// Into the rig's directory, whichever CA signed it.
	if err := testbed.WriteKeyPair(r.pki.Dir, c, testbed.CapsnapCertFile, testbed.CapsnapKeyFile); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := testbed.ReplaceFile(path, b); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
