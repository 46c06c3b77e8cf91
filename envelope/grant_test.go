package envelope

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func grantClaims() GrantClaims {
	c := claims()
	return GrantClaims{
		Audience: c.Audience, Subject: c.Subject, IssuedAt: c.IssuedAt,
		Expiry: now.Add(5 * time.Minute).Unix(), Epoch: c.Epoch, Tool: c.Tool,
		SchemaDigest: c.SchemaDigest, EffectClass: c.EffectClass, PolicyDigest: c.PolicyDigest,
	}
}

func callClaims(id string) *CallClaims {
	c := claims()
	return &CallClaims{IssuedAt: c.IssuedAt, Expiry: c.Expiry, ID: id, ArgsDigest: c.ArgsDigest, RequestID: c.RequestID}
}

func loadRecipient(t testing.TB, name string) *Recipient {
	t.Helper()
	r, err := LoadRecipient(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func grant(t testing.TB, k *Keys, r *Recipient, edit func(*GrantClaims)) *Grant {
	t.Helper()
	gc := grantClaims()
	if edit != nil {
		edit(&gc)
	}
	g, err := k.Grant(gc, r)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func seal(t testing.TB, g *Grant, c *CallClaims) string {
	t.Helper()
	token, err := g.Seal(c)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func TestVerifyUnderAGrant(t *testing.T) {
	a, other := loadKeys(t, "key-a.pem"), loadKeys(t, "key-b.pem")
	jwks := writeJWKS(t, a)
	billing, payments := loadRecipient(t, "grant-key-a.pub.pem"), loadRecipient(t, "grant-key-b.pub.pem")
	g := grant(t, a, billing, nil)
	good := seal(t, g, callClaims("call-1"))
	under := func(k *Keys, r *Recipient, edit func(*GrantClaims)) Presented {
		g := grant(t, k, r, edit)
		return Presented{seal(t, g, callClaims("call-1")), g.Token}
	}
	// Another grant with the same jti: its call key is another.
	twin := grant(t, a, billing, func(c *GrantClaims) { c.ID = g.Claims.ID })
	wrongKey := seal(t, twin, callClaims("call-1"))
	otherGrant := grant(t, a, billing, nil)
	whole, err := a.Seal(claims())
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Split(g.Token, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(edited[1])
	edited[1] = base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(payload), `"refund"`, `"refunds"`, 1)))

	tests := []struct {
		name      string
		presented Presented
		call      Call
		at        time.Time
		noKeys    bool
		want      Reason // "" verifies
	}{
		{"valid", Presented{good, g.Token}, refundCall, now, false, ""},
		{"valid within the leeway", Presented{good, g.Token}, refundCall, now.Add(34 * time.Second), false, ""},
		{"expired call", Presented{good, g.Token}, refundCall, now.Add(36 * time.Second), false, Expired},
		{"expired grant", under(a, billing, func(c *GrantClaims) { c.Expiry = now.Add(-time.Minute).Unix() }), refundCall, now, false, Expired},
		{"other arguments", Presented{good, g.Token}, Call{Tool: "refund", Arguments: json.RawMessage(`{"order_id":"A-100","amount":400,"reason_code":"duplicate_charge"}`)}, now, false, Mismatch},
		{"another tool", Presented{good, g.Token}, Call{Tool: "lookup_order", Arguments: refundCall.Arguments}, now, false, Mismatch},
		{"another request", Presented{good, g.Token}, Call{Tool: "refund", Arguments: refundCall.Arguments, RequestID: json.RawMessage(`8`)}, now, false, Mismatch},
		{"the grant missing", Presented{good, ""}, refundCall, now, false, Invalid},
		{"the envelope missing", Presented{"", g.Token}, refundCall, now, false, Missing},
		{"under another grant", Presented{good, otherGrant.Token}, refundCall, now, false, Invalid},
		{"MAC'd under another call key", Presented{wrongKey, g.Token}, refundCall, now, false, Invalid},
		{"the grant edited", Presented{good, strings.Join(edited, ".")}, refundCall, now, false, Invalid},
		{"the grant signed by a key not in the JWKS", under(other, billing, nil), refundCall, now, false, Invalid},
		{"a grant for another server", under(a, billing, func(c *GrantClaims) { c.Audience = "payments" }), refundCall, now, false, Foreign},
		{"the call key encrypted to another server", under(a, payments, nil), refundCall, now, false, Invalid},
		{"a grant, and no grant key here", Presented{good, g.Token}, refundCall, now, true, Invalid},
		{"an envelope signed whole, beside a grant", Presented{whole, g.Token}, refundCall, now, false, Invalid},
		{"the grant as the envelope", Presented{g.Token, ""}, refundCall, now, false, Invalid},
		{"the grant as its own envelope", Presented{g.Token, g.Token}, refundCall, now, false, Invalid},
		{"a grant claim missing", under(a, billing, func(c *GrantClaims) { c.SchemaDigest = "" }), refundCall, now, false, Invalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := VerifierOptions{Audience: "billing", JWKSFile: jwks, Now: func() time.Time { return tt.at }}
			if !tt.noKeys {
				o.GrantKeyFiles = []string{filepath.Join("testdata", "grant-key-a.pem")}
			}
			v, err := NewVerifier(o)
			if err != nil {
				t.Fatal(err)
			}
			c, err := v.Verify(tt.presented, tt.call)
			var e *Error
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want == "" && (c.Tool != "refund" || c.Subject != claims().Subject || c.Grant == "" || c.ID != "call-1" || c.Expiry != claims().Expiry):
				t.Fatalf("claims %+v", c)
			case tt.want != "" && (!errors.As(err, &e) || e.Reason != tt.want):
				t.Fatalf("Verify = %v, want %s", err, tt.want)
			}
		})
	}
}

// The same grant serves many calls, each its own envelope, opened once;
// an envelope used twice is a replay.
func TestGrantServesManyCallsOnce(t *testing.T) {
	a := loadKeys(t, "key-a.pem")
	v, err := NewVerifier(VerifierOptions{Audience: "billing", JWKSFile: writeJWKS(t, a), Now: func() time.Time { return now },
		GrantKeyFiles: []string{filepath.Join("testdata", "grant-key-b.pem"), filepath.Join("testdata", "grant-key-a.pem")}})
	if err != nil {
		t.Fatal(err)
	}
	g := grant(t, a, loadRecipient(t, "grant-key-a.pub.pem"), nil)
	first := seal(t, g, callClaims(""))
	for i, token := range []string{first, seal(t, g, callClaims(""))} {
		if _, err := v.Verify(Presented{token, g.Token}, refundCall); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := len(v.grants.m); n != 1 {
		t.Errorf("%d grants opened, want 1", n)
	}
	var e *Error
	if _, err := v.Verify(Presented{first, g.Token}, refundCall); !errors.As(err, &e) || e.Reason != Replayed {
		t.Fatalf("the same envelope twice: %v, want %s", err, Replayed)
	}
}

// The grant vector the TypeScript and Python verifiers are tested
// against: grant.jws (sealed with key-a.pem, its call key encrypted to
// grant-key-a.pub.pem) and call.jws under it verify for refundCall at now,
// under jwks.json and grant-key-a.pem. Neither is deterministic (the JWE's
// ephemeral key and IV, the call key), so -update makes a new pair and
// the test holds the pair kept to the verifier.
func TestGoldenGrant(t *testing.T) {
	grantFile, callFile := filepath.Join("testdata", "grant.jws"), filepath.Join("testdata", "call.jws")
	if *update {
		g := grant(t, loadKeys(t, "key-a.pem"), loadRecipient(t, "grant-key-a.pub.pem"), func(c *GrantClaims) { c.ID = "grant-1" })
		for p, v := range map[string]string{grantFile: g.Token, callFile: seal(t, g, callClaims("call-1"))} {
			if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	v, err := NewVerifier(VerifierOptions{Audience: "billing", JWKSFile: filepath.Join("testdata", "jwks.json"), Now: func() time.Time { return now.Add(5 * time.Second) },
		GrantKeyFiles: []string{filepath.Join("testdata", "grant-key-a.pem")}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.Verify(Presented{read(callFile), read(grantFile)}, refundCall)
	if err != nil {
		t.Fatal(err)
	}
	if c.Grant != "grant-1" || c.ID != "call-1" || c.Expiry != now.Add(30*time.Second).Unix() {
		t.Errorf("claims %+v", c)
	}
}

// What a call costs capsnap under a grant, against minting the grant
// (once per snapshot and tool) and sealing a whole envelope (BenchmarkSeal).
func BenchmarkGrant(b *testing.B) {
	k, err := LoadKeys(filepath.Join("testdata", "key-a.pem"))
	if err != nil {
		b.Fatal(err)
	}
	r := loadRecipient(b, "grant-key-a.pub.pem")
	b.Run("Grant", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := k.Grant(grantClaims(), r); err != nil {
				b.Fatal(err)
			}
		}
	})
	g := grant(b, k, r, nil)
	c := callClaims("")
	b.Run("Seal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c.ID = ""
			if _, err := g.Seal(c); err != nil {
				b.Fatal(err)
			}
		}
	})
	v, err := NewVerifier(VerifierOptions{Audience: "billing", JWKSFile: filepath.Join("testdata", "jwks.json"), Now: func() time.Time { return now },
		GrantKeyFiles: []string{filepath.Join("testdata", "grant-key-a.pem")}})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Verify", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c.ID = ""
			if _, err := v.Verify(Presented{seal(b, g, c), g.Token}, refundCall); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A call's claims are encoded by hand when that is sure to be what
// json.Marshal writes, and by json.Marshal otherwise: byte for byte the
// same either way.
func TestCallClaimsJSON(t *testing.T) {
	ids := []string{"", `7`, `-12`, `0`, `-0`, `"abc"`, `""`, `"a-b_c.d:e"`, `1.5`, `1e3`, `007`, `"a b"`, `"<x>"`, `"\u00e9"`, `"é"`, ` 7`, `"a\"b"`}
	strs := []string{"", "AbC9-_.:", "grant-1", "sha256:0f", "a b", "<&>", "é", `q"`, "\x01", "\u2028"}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		c := CallClaims{
			Grant: strs[r.IntN(len(strs))], IssuedAt: r.Int64N(4e9) - 2e9, Expiry: int64(i),
			ID: strs[r.IntN(len(strs))], ArgsDigest: strs[r.IntN(len(strs))],
		}
		if id := ids[r.IntN(len(ids))]; id != "" {
			c.RequestID = json.RawMessage(id)
		}
		want, err := json.Marshal(&c)
		got, ok := c.appendJSON(nil)
		switch {
		case ok && err != nil:
			t.Fatalf("%+v: encoded by hand as %s, json.Marshal refuses it: %v", c, got, err)
		case ok && string(got) != string(want):
			t.Fatalf("%+v: by hand %s, json.Marshal %s", c, got, want)
		}
	}
	plainCall := CallClaims{Grant: "g", ID: "j", ArgsDigest: "sha256:00", RequestID: json.RawMessage(`7`)}
	if _, ok := plainCall.appendJSON(nil); !ok {
		t.Error("the claims capsnap seals fell back to json.Marshal")
	}
}
