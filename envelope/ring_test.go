package envelope

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// The ring's times in these tests: a key is published 10 minutes before
// it signs, and kept 6 minutes after it last signed.
const (
	ahead   = 10 * time.Minute
	outlive = 6 * time.Minute
)

// ringKeys are the test keys by name, as PEM: key-a and key-b of
// testdata, and c made here.
func ringKeys(t *testing.T) map[byte][]byte {
	t.Helper()
	out := map[byte][]byte{}
	for name, file := range map[byte]string{'a': "key-a.pem", 'b': "key-b.pem"} {
		b, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = b
	}
	_, c, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(c)
	if err != nil {
		t.Fatal(err)
	}
	out['c'] = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	return out
}

// A rotation, step by step, on a fake clock: what signs and what is
// published after each. A step moves the clock, then, if it names a
// ring, writes those keys (in order) to the key file and reloads it.
func TestRotation(t *testing.T) {
	type step struct {
		after time.Duration
		ring  string
		signs string
		jwks  string
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"the key file's key replaced: published first, signs after publish-ahead, the old one kept until what it signed expired", []step{
			{ring: "a", signs: "a", jwks: "a"},
			{ring: "b", signs: "a", jwks: "ba"},
			{after: ahead - time.Second, signs: "a", jwks: "ba"},
			{after: time.Second, signs: "b", jwks: "ba"},
			{after: outlive - time.Second, signs: "b", jwks: "ba"},
			{after: time.Second, signs: "b", jwks: "b"},
		}},
		{"the new key listed second, then first, then alone", []step{
			{ring: "a", signs: "a", jwks: "a"},
			{ring: "ab", signs: "a", jwks: "ab"},
			{after: ahead, signs: "a", jwks: "ab"},
			{ring: "ba", signs: "b", jwks: "ba"},
			{after: time.Minute, ring: "b", signs: "b", jwks: "ba"},
			{after: outlive - time.Minute - time.Second, signs: "b", jwks: "ba"},
			{after: time.Second, signs: "b", jwks: "b"},
		}},
		{"the new key listed first too soon: it waits out publish-ahead", []step{
			{ring: "a", signs: "a", jwks: "a"},
			{ring: "ab", signs: "a", jwks: "ab"},
			{after: time.Minute, ring: "ba", signs: "a", jwks: "ba"},
			{after: ahead - time.Minute - time.Second, signs: "a", jwks: "ba"},
			{after: time.Second, signs: "b", jwks: "ba"},
		}},
		{"a key that never signed leaves at once", []step{
			{ring: "a", signs: "a", jwks: "a"},
			{ring: "ab", signs: "a", jwks: "ab"},
			{after: time.Hour, ring: "a", signs: "a", jwks: "a"},
		}},
		{"a change of mind before the new key signs: it never does", []step{
			{ring: "a", signs: "a", jwks: "a"},
			{ring: "b", signs: "a", jwks: "ba"},
			{after: 5 * time.Minute, ring: "c", signs: "a", jwks: "ca"},
			{after: ahead - time.Second, signs: "a", jwks: "ca"},
			{after: time.Second, signs: "c", jwks: "ca"},
			{after: outlive, signs: "c", jwks: "c"},
		}},
		{"back to the old key after the new one signed: the old signs at once, the new is kept", []step{
			{ring: "a", signs: "a", jwks: "a"},
			{ring: "b", signs: "a", jwks: "ba"},
			{after: ahead, signs: "b", jwks: "ba"},
			{after: time.Minute, ring: "a", signs: "a", jwks: "ab"},
			{after: outlive - time.Second, signs: "a", jwks: "ab"},
			{after: time.Second, signs: "a", jwks: "a"},
		}},
	}
	pems := ringKeys(t)
	kids := map[byte]string{}
	for name, p := range pems {
		f := filepath.Join(t.TempDir(), "key.pem")
		if err := os.WriteFile(f, p, 0o600); err != nil {
			t.Fatal(err)
		}
		kids[name] = loadKeysFrom(t, f).KeyID()
	}
	name := func(kid string) string {
		for n, k := range kids {
			if k == kid {
				return string(n)
			}
		}
		return "?" + kid
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "envelope.pem")
			clock := now
			var k *Keys
			for i, s := range tc.steps {
				clock = clock.Add(s.after)
				if s.ring != "" {
					var b []byte
					for _, n := range []byte(s.ring) {
						b = append(b, pems[n]...)
					}
					if err := os.WriteFile(file, b, 0o600); err != nil {
						t.Fatal(err)
					}
				}
				switch {
				case k == nil:
					var err error
					if k, err = OpenKeys(KeyOptions{PublishAhead: ahead, Outlive: outlive, Now: func() time.Time { return clock }}, file); err != nil {
						t.Fatal(err)
					}
				case s.ring != "":
					if _, err := k.Reload(); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
				}
				got := publishedNames(t, k, name)
				if got != s.jwks {
					t.Errorf("step %d (+%v): published %q, want %q", i, clock.Sub(now), got, s.jwks)
				}
				for what, kid := range signedBy(t, k) {
					if name(kid) != s.signs {
						t.Errorf("step %d (+%v): %s signed by %s, want %s", i, clock.Sub(now), what, name(kid), s.signs)
					}
				}
			}
		})
	}
}

func loadKeysFrom(t *testing.T, files ...string) *Keys {
	t.Helper()
	k, err := LoadKeys(files...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// publishedNames are the keys k's JWKS publishes, by name, in order.
func publishedNames(t *testing.T, k *Keys, name func(kid string) string) string {
	t.Helper()
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(k.JWKS(), &set); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, key := range set.Keys {
		b.WriteString(name(key.KeyID))
	}
	return b.String()
}

// signedBy is the kid in the header of what k signs now: an envelope, a
// grant, an audit checkpoint, and KeyID itself.
func signedBy(t *testing.T, k *Keys) map[string]string {
	t.Helper()
	r, err := LoadRecipient(filepath.Join("testdata", "grant-key-a.pub.pem"))
	if err != nil {
		t.Fatal(err)
	}
	envelope, err := k.Seal(claims())
	if err != nil {
		t.Fatal(err)
	}
	grant, err := k.Grant(GrantClaims{Audience: "billing", IssuedAt: now.Unix(), Expiry: now.Add(time.Minute).Unix()}, r)
	if err != nil {
		t.Fatal(err)
	}
	sign, err := k.Signer("capsnap-checkpoint+jwt")
	if err != nil {
		t.Fatal(err)
	}
	checkpoint, err := sign([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{"KeyID": k.KeyID()}
	for what, token := range map[string]string{"envelope": envelope, "grant": grant.Token, "checkpoint": checkpoint} {
		jws, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.EdDSA})
		if err != nil {
			t.Fatal(err)
		}
		out[what] = jws.Signatures[0].Header.KeyID
	}
	return out
}

// Key files that cannot be read, or that name a key twice, leave the ring
// as it was; files unchanged change nothing.
func TestReloadKeepsTheRingOnError(t *testing.T) {
	pems := ringKeys(t)
	file := filepath.Join(t.TempDir(), "envelope.pem")
	write := func(b []byte) {
		t.Helper()
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(pems['a'])
	k, err := OpenKeys(KeyOptions{PublishAhead: ahead, Outlive: outlive}, file)
	if err != nil {
		t.Fatal(err)
	}
	kid, jwks := k.KeyID(), string(k.JWKS())
	if changed, err := k.Reload(); changed || err != nil {
		t.Fatalf("Reload of the same file = %v, %v", changed, err)
	}
	for name, content := range map[string][]byte{
		"a truncated key":   pems['b'][:40],
		"no key":            []byte("not a key\n"),
		"a key twice":       append(append([]byte(nil), pems['b']...), pems['b']...),
		"a public key":      pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte{1}}),
		"a key, then junk":  append(append([]byte(nil), pems['b']...), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}})...),
		"an empty file":     nil,
		"a P-256 grant key": mustRead(t, filepath.Join("testdata", "grant-key-a.pem")),
	} {
		write(content)
		if changed, err := k.Reload(); err == nil || changed {
			t.Errorf("%s: Reload = %v, %v; want an error", name, changed, err)
		}
		if k.KeyID() != kid || string(k.JWKS()) != jwks {
			t.Errorf("%s: the ring changed", name)
		}
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Reload(); err == nil {
		t.Error("Reload of a missing file succeeded")
	}
}

func mustRead(t *testing.T, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Keys with nothing due read no clock when they sign: the hot path pays
// for rotation only while one is under way.
func TestSteadyKeysReadNoClock(t *testing.T) {
	var reads int
	k, err := OpenKeys(KeyOptions{PublishAhead: ahead, Outlive: outlive, Now: func() time.Time { reads++; return now }},
		filepath.Join("testdata", "key-a.pem"), filepath.Join("testdata", "key-b.pem"))
	if err != nil {
		t.Fatal(err)
	}
	before := reads
	for range 10 {
		if _, err := k.Seal(claims()); err != nil {
			t.Fatal(err)
		}
		k.JWKS()
	}
	if reads != before {
		t.Fatalf("10 seals read the clock %d times, want 0", reads-before)
	}
}

// Signing, reloading and the clock moving at once: whatever signs is
// published (run with -race).
func TestRotationConcurrently(t *testing.T) {
	pems := ringKeys(t)
	file := filepath.Join(t.TempDir(), "envelope.pem")
	if err := os.WriteFile(file, pems['a'], 0o600); err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	clock.Store(now.UnixNano())
	k, err := OpenKeys(KeyOptions{PublishAhead: time.Second, Outlive: outlive, Now: func() time.Time { return time.Unix(0, clock.Load()) }}, file)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			for {
				select {
				case <-done:
					errs <- nil
					return
				default:
				}
				token, err := k.Seal(claims())
				if err != nil {
					errs <- err
					return
				}
				jws, _ := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.EdDSA})
				if kid := jws.Signatures[0].Header.KeyID; !strings.Contains(string(k.JWKS()), `"`+kid+`"`) {
					errs <- fmt.Errorf("signed by %s, which is not published", kid)
					return
				}
			}
		}()
	}
	for i := range 200 {
		ring := [][]byte{pems['a'], pems['b'], pems['c']}[i%3]
		if err := os.WriteFile(file, ring, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := k.Reload(); err != nil {
			t.Fatal(err)
		}
		clock.Add(int64(700 * time.Millisecond))
	}
	close(done)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
