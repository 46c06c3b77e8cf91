package envelope

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
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
	var opened *openGrant
	for i, token := range []string{first, seal(t, g, callClaims(""))} {
		if _, err := v.Verify(Presented{token, g.Token}, refundCall); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		// Opened again, the grant would be kept anew.
		if kept := v.grants.get(g.Token); kept == nil || opened != nil && kept != opened {
			t.Fatalf("call %d: the grant was opened again", i)
		} else {
			opened = kept
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
		got, ok := c.appendJSON(nil, []byte(c.ID))
		switch {
		case ok && err != nil:
			t.Fatalf("%+v: encoded by hand as %s, json.Marshal refuses it: %v", c, got, err)
		case ok && string(got) != string(want):
			t.Fatalf("%+v: by hand %s, json.Marshal %s", c, got, want)
		}
	}
	plainCall := CallClaims{Grant: "g", ID: "j", ArgsDigest: "sha256:00", RequestID: json.RawMessage(`7`)}
	if _, ok := plainCall.appendJSON(nil, []byte(plainCall.ID)); !ok {
		t.Error("the claims capsnap seals fell back to json.Marshal")
	}
}

// Grants and calls made by hand, each refused where it is wrong: what
// Keys.Grant and Grant.Seal never make, a forger might.
func TestGrantRefusals(t *testing.T) {
	a := loadKeys(t, "key-a.pem")
	jwks := writeJWKS(t, a)
	billing := loadRecipient(t, "grant-key-a.pub.pem")
	v, err := NewVerifier(VerifierOptions{Audience: "billing", JWKSFile: jwks, Now: func() time.Time { return now },
		GrantKeyFiles: []string{filepath.Join("testdata", "grant-key-a.pem")}})
	if err != nil {
		t.Fatal(err)
	}
	// signed is a grant with claims gc, signed as Keys.Grant signs.
	signed := func(gc GrantClaims) string {
		gc.Issuer = Issuer
		payload, err := json.Marshal(gc)
		if err != nil {
			t.Fatal(err)
		}
		token, err := signCompact(a.signing().grant, payload)
		if err != nil {
			t.Fatal(err)
		}
		return token
	}
	// callKey is key encrypted to the grant key in file, labelled kid.
	callKey := func(file, kid string, key []byte) string {
		enc, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{Algorithm: jose.ECDH_ES, Key: grantPublic(t, file), KeyID: kid}, nil)
		if err != nil {
			t.Fatal(err)
		}
		jwe, err := enc.Encrypt(key)
		if err != nil {
			t.Fatal(err)
		}
		out, err := jwe.CompactSerialize()
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	kidA := grantKeyID(t, "grant-key-a.pub.pem")
	key := make([]byte, callKeySize)
	with := func(edit func(*GrantClaims)) string {
		gc := grantClaims()
		gc.ID, gc.CallKey = "grant-x", callKey("grant-key-a.pub.pem", kidA, key)
		edit(&gc)
		return signed(gc)
	}
	// A genuine grant, and envelopes MAC'd by hand under its call key.
	g := grant(t, a, billing, nil)
	if _, err := v.Verify(Presented{seal(t, g, callClaims("call-0")), g.Token}, refundCall); err != nil {
		t.Fatal(err)
	}
	mac := func(kid, payload string) string {
		header := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","kid":"` + kid + `","typ":"` + CallType + `"}`))
		signing := header + "." + base64.RawURLEncoding.EncodeToString([]byte(payload))
		h := hmac.New(sha256.New, v.grants.get(g.Token).key)
		h.Write([]byte(signing))
		return signing + "." + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
	}
	call, err := json.Marshal(callClaims("call-1"))
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(call, &fields); err != nil {
		t.Fatal(err)
	}
	claimsWith := func(k string, val any) string {
		m := maps.Clone(fields)
		m["grant"] = g.Claims.ID
		m[k] = val
		b, _ := json.Marshal(m)
		return string(b)
	}

	for _, tt := range []struct {
		name      string
		presented Presented
		detail    string
	}{
		{"a grant without a call key", Presented{"x", with(func(c *GrantClaims) { c.CallKey = "" })}, "a grant claim is missing"},
		{"a grant without a jti", Presented{"x", with(func(c *GrantClaims) { c.ID = "" })}, "a grant claim is missing"},
		{"a call key that is not a JWE", Presented{"x", with(func(c *GrantClaims) { c.CallKey = "x.y" })}, "not a compact ECDH-ES/A256GCM JWE"},
		{"a call key for another server's grant key, labelled as ours", Presented{"x", with(func(c *GrantClaims) {
			c.CallKey = callKey("grant-key-b.pub.pem", kidA, key)
		})}, "does not decrypt"},
		{"a call key of the wrong size", Presented{"x", with(func(c *GrantClaims) {
			c.CallKey = callKey("grant-key-a.pub.pem", kidA, key[:16])
		})}, "does not decrypt"},
		{"call claims with a member more", Presented{mac(g.Claims.ID, claimsWith("extra", 1)), g.Token}, "unknown field"},
		{"call claims naming another grant", Presented{mac(g.Claims.ID, claimsWith("grant", "grant-other")), g.Token}, "names grant"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := v.Verify(tt.presented, refundCall)
			var e *Error
			if !errors.As(err, &e) || e.Reason != Invalid || !strings.Contains(e.Detail, tt.detail) {
				t.Fatalf("Verify = %v, want %s: …%s…", err, Invalid, tt.detail)
			}
		})
	}
}

// grantPublic is the public grant key in testdata's file.
func grantPublic(t *testing.T, file string) any {
	t.Helper()
	der, err := readFirstPEM(filepath.Join("testdata", file), "PUBLIC KEY", "")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// grantKeyID is the kid of the grant key in file: its RFC 7638 thumbprint.
func grantKeyID(t *testing.T, file string) string {
	t.Helper()
	kid, err := thumbprint(grantPublic(t, file))
	if err != nil {
		t.Fatal(err)
	}
	return kid
}

// A full grant cache drops the expired grants first, and starts over only
// if every grant is live.
func TestGrantCacheFull(t *testing.T) {
	var c grantCache
	live, expired := &openGrant{claims: GrantClaims{Expiry: now.Add(time.Minute).Unix()}}, &openGrant{claims: GrantClaims{Expiry: now.Add(-time.Minute).Unix()}}
	for i := range maxGrants {
		g := live
		if i%2 == 1 {
			g = expired
		}
		c.put(fmt.Sprint(i), g, now)
	}
	c.put("one more", live, now)
	if n := len(c.m); n != maxGrants/2+1 || c.get("0") != live || c.get("1") != nil || c.get("one more") != live {
		t.Fatalf("after the expired were dropped: %d grants, 0 %v, 1 %v", n, c.get("0"), c.get("1"))
	}
	var full grantCache
	for i := range maxGrants {
		full.put(fmt.Sprint(i), live, now)
	}
	full.put("one more", live, now)
	if n := len(full.m); n != 1 || full.get("one more") != live {
		t.Fatalf("a cache of live grants did not start over: %d grants", n)
	}
}

// A call sealed without a jti gets a new one, which Seal sets on its
// claims and which is the one the token carries: the two share one string.
func TestSealMakesTheJTI(t *testing.T) {
	g := grant(t, loadKeys(t, "key-a.pem"), loadRecipient(t, "grant-key-a.pub.pem"), nil)
	v, err := NewVerifier(VerifierOptions{Audience: "billing", JWKSFile: filepath.Join("testdata", "jwks.json"), Now: func() time.Time { return now },
		GrantKeyFiles: []string{filepath.Join("testdata", "grant-key-a.pem")}})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for range 3 {
		c := callClaims("")
		token := seal(t, g, c)
		if len(c.ID) != idLen || !plain(c.ID) || seen[c.ID] {
			t.Fatalf("jti %q: want a new one of %d plain characters", c.ID, idLen)
		}
		seen[c.ID] = true
		if strings.Contains(token, c.ID) {
			t.Fatalf("the token %s ends in its jti %s", token, c.ID)
		}
		got, err := v.Verify(Presented{token, g.Token}, refundCall)
		if err != nil || got.ID != c.ID {
			t.Fatalf("the token carries jti %q (%v), Seal set %q", got.ID, err, c.ID)
		}
	}
}
