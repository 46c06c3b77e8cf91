package envelope

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var now = time.Unix(1_900_000_000, 0)

func loadKeys(t *testing.T, files ...string) *Keys {
	t.Helper()
	for i, f := range files {
		files[i] = filepath.Join("testdata", f)
	}
	k, err := LoadKeys(files...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writeJWKS(t *testing.T, k *Keys) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(p, k.JWKS(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func claims() *Claims {
	return &Claims{
		Audience: "billing", Subject: "spiffe://acme/agent/support-refund",
		IssuedAt: now.Unix(), Expiry: now.Add(30 * time.Second).Unix(), ID: "jti-1",
		Epoch: "ep_AAAAAAAAAAAAAAAAAAAAAA", Tool: "refund",
		SchemaDigest: "sha256:5e177605107699acf71fd66e4e4366fc564025700b218c6f3b3525f4f99833c2",
		EffectClass:  "money_move", PolicyDigest: "sha256:ae3e0e18f5b004ea65fb8a2a752186e401bebc83a0edc0a716de72f70d4e5d02",
		ArgsDigest: mustArgs(`{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`),
		RequestID:  json.RawMessage(`7`),
	}
}

func mustArgs(args string) string {
	d, err := ArgsDigest(json.RawMessage(args))
	if err != nil {
		panic(err)
	}
	return d
}

var refundCall = Call{Tool: "refund", Arguments: json.RawMessage(`{"reason_code":"duplicate_charge", "amount":40.0, "order_id":"A-100"}`), RequestID: json.RawMessage(`7`)}

// The arguments are bound by their canonical form: the same object
// written another way has the same digest, another object another one.
func TestArgsDigest(t *testing.T) {
	tests := []struct {
		a, b string
		same bool
	}{
		{`{"a":1,"b":"x"}`, `{ "b" : "x", "a" : 1.0 }`, true},
		{`{"s":"\u00e9"}`, `{"s":"é"}`, true},
		{``, `{}`, true},
		{`null`, `{}`, true},
		{`{"amount":40}`, `{"amount":41}`, false},
		{`{"amount":40}`, `{"amount":"40"}`, false},
		{`{"a":{"b":[1,2]}}`, `{"a":{"b":[2,1]}}`, false},
	}
	for _, tt := range tests {
		a, b := mustArgs(tt.a), mustArgs(tt.b)
		if (a == b) != tt.same {
			t.Errorf("ArgsDigest(%s) = %s, ArgsDigest(%s) = %s; same = %v, want %v", tt.a, a, tt.b, b, a == b, tt.same)
		}
	}
	if _, err := ArgsDigest(json.RawMessage(`{"a":`)); err == nil {
		t.Error("ArgsDigest accepted invalid JSON")
	}
}

// An envelope is deterministic (Ed25519 signatures are): the golden file
// is the one the TypeScript and Python verifiers are tested against too.
func TestGoldenEnvelope(t *testing.T) {
	k := loadKeys(t, "key-a.pem")
	token, err := k.Seal(claims())
	if err != nil {
		t.Fatal(err)
	}
	golden := map[string]string{"envelope.jws": token + "\n", "jwks.json": string(k.JWKS()) + "\n"}
	for name, got := range golden {
		p := filepath.Join("testdata", name)
		if *update {
			if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if got != string(want) {
			t.Errorf("%s changed (go test -update to accept):\n got %s\nwant %s", name, got, want)
		}
	}
	header, _, _ := strings.Cut(token, ".")
	h, _ := base64.RawURLEncoding.DecodeString(header)
	if want := `{"alg":"EdDSA","kid":"` + k.KeyID() + `","typ":"` + Type + `"}`; string(h) != want {
		t.Errorf("protected header %s, want %s", h, want)
	}
}

func TestVerify(t *testing.T) {
	a, b := loadKeys(t, "key-a.pem"), loadKeys(t, "key-b.pem")
	jwksA := writeJWKS(t, a)
	seal := func(k *Keys, edit func(*Claims)) string {
		c := claims()
		if edit != nil {
			edit(c)
		}
		token, err := k.Seal(c)
		if err != nil {
			t.Fatal(err)
		}
		return token
	}
	// An HMAC signed with the public key's bytes: the classic confusion.
	pub := a.signing().private.Public().(ed25519.PublicKey)
	hs, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte(pub)}, (&jose.SignerOptions{}).WithType(Type).WithHeader("kid", a.KeyID()))
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(claims())
	hsJWS, _ := hs.Sign(payload)
	hsToken, _ := hsJWS.CompactSerialize()
	checkpoint, err := a.Signer("capsnap-checkpoint+jwt")
	if err != nil {
		t.Fatal(err)
	}
	otherType, _ := checkpoint(payload)
	good := seal(a, nil)
	tampered := strings.Split(good, ".")
	tampered[1] = base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(payload), `"refund"`, `"refunds"`, 1)))

	tests := []struct {
		name  string
		token string
		call  Call
		at    time.Time
		want  Reason // "" verifies
	}{
		{"valid", good, refundCall, now, ""},
		{"valid, without a request id to compare", good, Call{Tool: refundCall.Tool, Arguments: refundCall.Arguments}, now, ""},
		{"valid within the leeway", good, refundCall, now.Add(34 * time.Second), ""},
		{"missing", "", refundCall, now, Missing},
		{"garbled", "not.a.jws", refundCall, now, Invalid},
		{"payload edited", strings.Join(tampered, "."), refundCall, now, Invalid},
		{"HS256 keyed with the public key", hsToken, refundCall, now, Invalid},
		{"another typ under the same key", otherType, refundCall, now, Invalid},
		{"signed by a key not in the JWKS", seal(b, nil), refundCall, now, Invalid},
		{"expired", good, refundCall, now.Add(36 * time.Second), Expired},
		{"for another server", seal(a, func(c *Claims) { c.Audience = "payments" }), refundCall, now, Foreign},
		{"another tool", good, Call{Tool: "lookup_order", Arguments: refundCall.Arguments}, now, Mismatch},
		{"other arguments", good, Call{Tool: "refund", Arguments: json.RawMessage(`{"order_id":"A-100","amount":400,"reason_code":"duplicate_charge"}`)}, now, Mismatch},
		{"another request", good, Call{Tool: "refund", Arguments: refundCall.Arguments, RequestID: json.RawMessage(`8`)}, now, Mismatch},
		{"a claim missing", seal(a, func(c *Claims) { c.SchemaDigest = "" }), refundCall, now, Invalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := NewVerifier(VerifierOptions{Audience: "billing", JWKSFile: jwksA, Now: func() time.Time { return tt.at }})
			if err != nil {
				t.Fatal(err)
			}
			c, err := v.Verify(Presented{Envelope: tt.token}, tt.call)
			var e *Error
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want == "" && (c.Tool != "refund" || c.Subject != claims().Subject):
				t.Fatalf("claims %+v", c)
			case tt.want != "" && (!errors.As(err, &e) || e.Reason != tt.want):
				t.Fatalf("Verify = %v, want %s", err, tt.want)
			}
		})
	}
}

func TestVerifyRefusesAReplay(t *testing.T) {
	a := loadKeys(t, "key-a.pem")
	v, err := NewVerifier(VerifierOptions{Audience: "billing", JWKSFile: writeJWKS(t, a), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	token, _ := a.Seal(claims())
	if _, err := v.Verify(Presented{Envelope: token}, refundCall); err != nil {
		t.Fatal(err)
	}
	var e *Error
	if _, err := v.Verify(Presented{Envelope: token}, refundCall); !errors.As(err, &e) || e.Reason != Replayed {
		t.Fatalf("the same envelope twice: %v, want %s", err, Replayed)
	}
}

// Rotation: capsnap publishes the new key before it signs with it; a
// verifier on the JWKS URL fetches it again when an envelope names a kid
// it does not know.
func TestRotationThroughTheJWKSURL(t *testing.T) {
	old, both, next := loadKeys(t, "key-a.pem"), loadKeys(t, "key-a.pem", "key-b.pem"), loadKeys(t, "key-b.pem", "key-a.pem")
	var published atomic.Pointer[[]byte]
	jwks := old.JWKS()
	published.Store(&jwks)
	var fetches atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fetches.Add(1)
		_, _ = w.Write(*published.Load())
	}))
	defer srv.Close()
	clock := now
	v, err := NewVerifier(VerifierOptions{Audience: "billing", JWKSURL: srv.URL, Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	verify := func(k *Keys, id string) error {
		c := claims()
		c.ID = id
		token, err := k.Seal(c)
		if err != nil {
			t.Fatal(err)
		}
		_, err = v.Verify(Presented{Envelope: token}, refundCall)
		return err
	}
	if err := verify(old, "1"); err != nil {
		t.Fatal(err)
	}
	jwks = both.JWKS() // step 1: the new key is published, the old one still signs
	published.Store(&jwks)
	if err := verify(both, "2"); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(11 * time.Second) // step 2: the new key signs
	if err := verify(next, "3"); err != nil {
		t.Fatalf("after rotation: %v", err)
	}
	if n := fetches.Load(); n != 2 {
		t.Errorf("%d JWKS fetches, want 2: the first use and the unknown kid", n)
	}
}

func TestLoadKeysRefusesOtherKeys(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"not-pem": "hello",
		"rsa":     "-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu\n-----END RSA PRIVATE KEY-----\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadKeys(p); err == nil {
			t.Errorf("LoadKeys(%s) accepted it", name)
		}
	}
	if _, err := LoadKeys(filepath.Join("testdata", "key-a.pem"), filepath.Join("testdata", "key-a.pem")); err == nil {
		t.Error("LoadKeys accepted the same key twice")
	}
	if _, err := LoadKeys(); err == nil {
		t.Error("LoadKeys accepted no keys")
	}
}

func BenchmarkSeal(b *testing.B) {
	k, err := LoadKeys(filepath.Join("testdata", "key-a.pem"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.Seal(claims()); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSealParts(b *testing.B) {
	k, err := LoadKeys(filepath.Join("testdata", "key-a.pem"))
	if err != nil {
		b.Fatal(err)
	}
	c := claims()
	payload, _ := json.Marshal(c)
	b.Run("ed25519.Sign", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ed25519.Sign(k.signing().private, payload)
		}
	})
	b.Run("jose.Sign", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := k.sign(payload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ArgsDigest", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ArgsDigest(refundCall.Arguments); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Seal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c.ID = ""
			if _, err := k.Seal(c); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A JWKS URL that cannot be fetched refuses the envelope as invalid (an
// *Error, as every refusal), and is not fetched again by every call.
func TestUnreachableJWKS(t *testing.T) {
	a := loadKeys(t, "key-a.pem")
	var fetches atomic.Int32
	var up atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fetches.Add(1)
		if !up.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		w.Write(a.JWKS())
	}))
	defer srv.Close()
	at := now
	v, err := NewVerifier(VerifierOptions{Audience: "billing", JWKSURL: srv.URL, Now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	token, _ := a.Seal(claims())
	for range 3 {
		var e *Error
		if _, err := v.Verify(Presented{Envelope: token}, refundCall); !errors.As(err, &e) || e.Reason != Invalid {
			t.Fatalf("Verify = %v, want %s", err, Invalid)
		}
	}
	if n := fetches.Load(); n != 1 {
		t.Errorf("%d fetches in the same second, want 1", n)
	}
	// A failed fetch is tried again a second later, not only at Refresh.
	up.Store(true)
	at = now.Add(2 * time.Second)
	if _, err := v.Verify(Presented{Envelope: token}, refundCall); err != nil {
		t.Fatalf("the JWKS back: %v", err)
	}
	if n := fetches.Load(); n != 2 {
		t.Errorf("%d fetches, want 2", n)
	}
}
