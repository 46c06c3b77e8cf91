package approval_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/approval"
)

const (
	testIssuer   = "https://idp.acme.example"
	testAudience = "capsnap-approvals"
)

// idp is an identity provider: a signing key and its JWKS.
type idp struct {
	key  *ecdsa.PrivateKey
	kid  string
	jwks []byte
}

func newIDP(t *testing.T, kid string) *idp {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	jwks, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: key.Public(), KeyID: kid, Algorithm: "ES256", Use: "sig"}}})
	if err != nil {
		t.Fatal(err)
	}
	return &idp{key, kid, jwks}
}

// file writes the JWKS to a file.
func (p *idp) file(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(path, p.jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// sign signs claims, with the usual ones for sub unless claims sets them.
func (p *idp) sign(t *testing.T, sub string, claims map[string]any) string {
	t.Helper()
	now := time.Now()
	all := map[string]any{
		"iss": testIssuer, "aud": []string{testAudience}, "sub": sub,
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "groups": []string{"billing-oncall"},
	}
	for k, v := range claims {
		if v == nil {
			delete(all, k)
		} else {
			all[k] = v
		}
	}
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: p.key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), p.kid))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(sig).Claims(all).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (p *idp) authenticator(t *testing.T, edit ...func(*approval.JWTConfig)) *approval.JWT {
	t.Helper()
	c := approval.JWTConfig{JWKSFile: p.file(t), Issuer: testIssuer, Audience: testAudience}
	for _, e := range edit {
		e(&c)
	}
	a, err := approval.NewJWT(c)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestJWT(t *testing.T) {
	p := newIDP(t, "k1")
	auth := p.authenticator(t)
	other := newIDP(t, "k1") // another key under the same kid
	hs := func() string {
		sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: p.jwks}, (&jose.SignerOptions{}).WithHeader("kid", "k1"))
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(sig).Claims(map[string]any{"iss": testIssuer, "aud": testAudience, "sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}()
	unsigned := func() string {
		parts := strings.Split(p.sign(t, "alice", nil), ".")
		return `eyJhbGciOiJub25lIn0.` + parts[1] + "."
	}()
	tests := []struct {
		name  string
		token string
		want  approval.Approver
		err   string
	}{
		{"valid", p.sign(t, "alice@acme.example", nil), approval.Approver{ID: "alice@acme.example", Groups: []string{"billing-oncall"}}, ""},
		{"groups as a string", p.sign(t, "bob", map[string]any{"groups": "ops"}), approval.Approver{ID: "bob", Groups: []string{"ops"}}, ""},
		{"no groups", p.sign(t, "bob", map[string]any{"groups": nil}), approval.Approver{ID: "bob"}, ""},
		{"audience as a string", p.sign(t, "bob", map[string]any{"aud": testAudience, "groups": nil}), approval.Approver{ID: "bob"}, ""},
		{"expired", p.sign(t, "alice", map[string]any{"exp": time.Now().Add(-time.Minute).Unix()}), approval.Approver{}, "exp"},
		{"not yet valid", p.sign(t, "alice", map[string]any{"nbf": time.Now().Add(time.Hour).Unix()}), approval.Approver{}, "nbf"},
		{"no expiry", p.sign(t, "alice", map[string]any{"exp": nil}), approval.Approver{}, "no expiry"},
		{"wrong issuer", p.sign(t, "alice", map[string]any{"iss": "https://evil.example"}), approval.Approver{}, "iss"},
		{"wrong audience", p.sign(t, "alice", map[string]any{"aud": []string{"billing"}}), approval.Approver{}, "aud"},
		{"bad signature", other.sign(t, "alice", nil), approval.Approver{}, "no key"},
		{"a tampered payload", func() string {
			parts := strings.Split(p.sign(t, "alice", nil), ".")
			parts[1] = strings.Split(p.sign(t, "root", nil), ".")[1]
			return strings.Join(parts, ".")
		}(), approval.Approver{}, "no key"},
		{"HMAC with the JWKS as the secret", hs, approval.Approver{}, "unexpected signature algorithm"},
		{"alg none", unsigned, approval.Approver{}, "unexpected signature algorithm"},
		{"no subject", p.sign(t, "", nil), approval.Approver{}, "no sub claim"},
		{"groups not strings", p.sign(t, "alice", map[string]any{"groups": []int{1}}), approval.Approver{}, "groups"},
		{"missing token", "", approval.Approver{}, "no token"},
		{"not a JWT", "hello", approval.Approver{}, "compact JWS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := auth.Authenticate(context.Background(), tt.token)
			if tt.err == "" {
				if err != nil || !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("= %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, approval.ErrUnauthenticated) || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("= %+v, %v; want ErrUnauthenticated about %q", got, err, tt.err)
			}
		})
	}
}

// Other claims name the approver and their groups where the identity
// provider puts them elsewhere.
func TestJWTClaims(t *testing.T) {
	p := newIDP(t, "k1")
	auth := p.authenticator(t, func(c *approval.JWTConfig) { c.IdentityClaim, c.GroupsClaim = "email", "roles" })
	got, err := auth.Authenticate(context.Background(), p.sign(t, "u-123", map[string]any{"email": "alice@acme.example", "roles": []string{"approver"}}))
	if err != nil || !reflect.DeepEqual(got, approval.Approver{ID: "alice@acme.example", Groups: []string{"approver"}}) {
		t.Fatalf("= %+v, %v", got, err)
	}
}

// A JWKS URL is fetched at start, and again when a token names a key it
// does not hold: a rotated key is honoured without a restart.
func TestJWKSURL(t *testing.T) {
	old, rotated := newIDP(t, "old"), newIDP(t, "new")
	var served atomic.Pointer[[]byte]
	served.Store(&old.jwks)
	var fetches atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fetches.Add(1)
		_, _ = w.Write(*served.Load())
	}))
	defer srv.Close()
	now := time.Now()
	clk := &clock{t: now}
	auth, err := approval.NewJWT(approval.JWTConfig{JWKSURL: srv.URL, Issuer: testIssuer, Audience: testAudience, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auth.Authenticate(context.Background(), old.sign(t, "alice", nil)); err != nil {
		t.Fatal(err)
	}
	served.Store(&rotated.jwks)
	if _, err := auth.Authenticate(context.Background(), rotated.sign(t, "alice", nil)); err == nil {
		t.Fatal("a new key honoured before the least time between reads")
	}
	clk.Advance(11 * time.Second)
	if _, err := auth.Authenticate(context.Background(), rotated.sign(t, "alice", nil)); err != nil {
		t.Fatalf("the rotated key: %v", err)
	}
	if n := fetches.Load(); n != 2 {
		t.Fatalf("%d fetches, want 2", n)
	}
	if _, err := approval.NewJWT(approval.JWTConfig{JWKSURL: srv.URL + "/nope", Issuer: testIssuer, Audience: testAudience,
		Client: &http.Client{Transport: http.NewFileTransport(http.Dir(t.TempDir()))}}); err == nil {
		t.Fatal("a JWKS URL that does not answer: no error")
	}
}

func TestNewJWTRefuses(t *testing.T) {
	p := newIDP(t, "k1")
	priv, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: p.key, KeyID: "k1"}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for name, c := range map[string]approval.JWTConfig{
		"no JWKS":          {Issuer: testIssuer, Audience: testAudience},
		"two JWKS":         {JWKSFile: p.file(t), JWKSURL: "https://idp/jwks", Issuer: testIssuer, Audience: testAudience},
		"no issuer":        {JWKSFile: p.file(t), Audience: testAudience},
		"no audience":      {JWKSFile: p.file(t), Issuer: testIssuer},
		"an empty JWKS":    {JWKSFile: write("empty.json", []byte(`{"keys":[]}`)), Issuer: testIssuer, Audience: testAudience},
		"a private key":    {JWKSFile: write("private.json", priv), Issuer: testIssuer, Audience: testAudience},
		"a missing file":   {JWKSFile: filepath.Join(dir, "nope.json"), Issuer: testIssuer, Audience: testAudience},
		"not JSON at all":  {JWKSFile: write("text.json", []byte("keys")), Issuer: testIssuer, Audience: testAudience},
		"a JWKS URL typo":  {JWKSURL: "://", Issuer: testIssuer, Audience: testAudience},
		"neither, quietly": {},
	} {
		if _, err := approval.NewJWT(c); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestDevTokens(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		path := filepath.Join(dir, "tokens.yaml")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	var log bytes.Buffer
	d, err := approval.LoadDevTokens(write(`tokens:
  - token: demo-oncall-token-0001
    approver: oncall@acme.example
    groups: [billing-oncall]
`), zerolog.New(&log))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "DEV TOKENS IN FORCE") || !strings.Contains(log.String(), `"level":"warn"`) {
		t.Errorf("loading dev tokens said nothing loud: %s", log.String())
	}
	got, err := d.Authenticate(context.Background(), "demo-oncall-token-0001")
	if err != nil || !reflect.DeepEqual(got, approval.Approver{ID: "oncall@acme.example", Groups: []string{"billing-oncall"}}) {
		t.Fatalf("= %+v, %v", got, err)
	}
	for _, tok := range []string{"", "demo-oncall-token-0002", "demo-oncall-token-000"} {
		if _, err := d.Authenticate(context.Background(), tok); !errors.Is(err, approval.ErrUnauthenticated) {
			t.Errorf("token %q: %v", tok, err)
		}
	}
	for name, body := range map[string]string{
		"short":        "tokens:\n  - {token: short, approver: a}\n",
		"no approver":  "tokens:\n  - {token: a-long-enough-token}\n",
		"twice":        "tokens:\n  - {token: a-long-enough-token, approver: a}\n  - {token: a-long-enough-token, approver: b}\n",
		"none":         "tokens: []\n",
		"an odd field": "tokens:\n  - {token: a-long-enough-token, approver: a, admin: true}\n",
	} {
		if _, err := approval.LoadDevTokens(write(body), zerolog.Nop()); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}
