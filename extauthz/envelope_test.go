package extauthz

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/envelope"
)

// envelopeFixture is a fixture whose allowed calls carry an envelope signed
// with envelope/testdata's key-a, and a verifier for the billing server.
func envelopeFixture(t *testing.T, ttl time.Duration) (*fixture, *envelope.Verifier) {
	t.Helper()
	keys, err := envelope.LoadKeys(filepath.Join("..", "envelope", "testdata", "key-a.pem"))
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(o *Options) { o.Envelope, o.EnvelopeTTL = keys, ttl })
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(jwks, keys.JWKS(), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := envelope.NewVerifier(envelope.VerifierOptions{Audience: "billing", JWKSFile: jwks, Now: f.clock.now})
	if err != nil {
		t.Fatal(err)
	}
	return f, v
}

// An allowed call's envelope binds exactly what was verified, and verifies
// for that call alone; its audit line names it.
func TestEnvelopeOfAnAllowedCall(t *testing.T) {
	f, v := envelopeFixture(t, 30*time.Second)
	f.list(t, support, "billing", nil)
	o := f.call(t, checkCase{Principal: support, ServerID: "billing", Body: callBody("refund")})
	if o.reason != "" {
		t.Fatalf("refund denied: %s", o.reason)
	}
	token := o.upstream[envelope.Header]
	if token == "" {
		t.Fatalf("the allowed call carries no %s: %v", envelope.Header, o.upstream)
	}
	call := envelope.Call{Tool: "refund", Arguments: json.RawMessage(validArgs["refund"]), RequestID: json.RawMessage(`1`)}
	c, err := v.Verify(token, call)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case c.Audience != "billing" || c.Subject != support || c.Tool != "refund":
		t.Errorf("claims %+v", c)
	case c.SchemaDigest != o.upstream[HeaderSchemaDigest] || c.PolicyDigest != o.upstream[HeaderPolicyDigest] ||
		c.EffectClass != o.upstream[HeaderEffectClass] || c.Epoch != o.upstream[HeaderEpoch]:
		t.Errorf("claims %+v disagree with the pin headers %v", c, o.upstream)
	case c.Expiry-c.IssuedAt != 30:
		t.Errorf("envelope valid for %ds, want 30", c.Expiry-c.IssuedAt)
	}
	if !strings.Contains(f.audit.String(), `"envelope":"`+c.ID+`"`) {
		t.Errorf("no audit line names envelope %s:\n%s", c.ID, f.audit)
	}
	// The same envelope for other arguments is refused.
	other := call
	other.Arguments = json.RawMessage(`{"order_id":"A-100","amount":250,"reason_code":"duplicate_charge"}`)
	var e *envelope.Error
	if _, err := v.Verify(token, other); !errors.As(err, &e) || e.Reason != envelope.Mismatch {
		t.Errorf("the envelope for other arguments: %v", err)
	}
}

// An envelope never outlives its snapshot.
func TestEnvelopeEndsWithItsSnapshot(t *testing.T) {
	f, _ := envelopeFixture(t, time.Minute)
	f.list(t, support, "billing", nil)
	f.clock.advance(5*time.Minute - 10*time.Second) // 10s of the snapshot left
	f.billing.push(t, "testdata/catalog.json", nil) // the catalog confirmed fresh again
	o := f.call(t, checkCase{Principal: support, ServerID: "billing", Body: callBody("lookup_order")})
	if o.reason != "" {
		t.Fatalf("lookup_order denied: %s", o.reason)
	}
	payload := strings.Split(o.upstream[envelope.Header], ".")[1]
	var c envelope.Claims
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	if c.Expiry-c.IssuedAt != 10 {
		t.Errorf("envelope valid for %ds; the snapshot had 10s left", c.Expiry-c.IssuedAt)
	}
}

// Without envelope keys no envelope is sent, and one a client sends never
// reaches the upstream; a denied call has none.
func TestEnvelopeFromAClientIsRemoved(t *testing.T) {
	f := newFixture(t)
	f.list(t, support, "billing", nil)
	resp, err := f.Check(context.Background(), checkCase{Principal: support, ServerID: "billing", Body: callBody("refund"),
		Headers: map[string]string{envelope.Header: "forged"}}.request())
	if err != nil {
		t.Fatal(err)
	}
	ok := resp.GetOkResponse()
	if ok == nil {
		t.Fatal("refund denied")
	}
	for _, h := range ok.GetHeaders() {
		if h.GetHeader().GetKey() == envelope.Header {
			t.Fatalf("capsnap set %s without keys", envelope.Header)
		}
	}
	removed := false
	for _, h := range ok.GetHeadersToRemove() {
		removed = removed || h == envelope.Header
	}
	if !removed {
		t.Fatalf("the client's %s is not removed: %v", envelope.Header, ok.GetHeadersToRemove())
	}

	fe, _ := envelopeFixture(t, 30*time.Second)
	fe.list(t, support, "billing", nil)
	if o := fe.call(t, checkCase{Principal: support, ServerID: "billing", Body: callBody("delete_all_orders")}); o.reason == "" || o.upstream != nil {
		t.Fatalf("a denied call: %+v", o)
	}
}
