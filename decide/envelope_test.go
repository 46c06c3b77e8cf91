package decide

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/envelope"
)

// envelopeFixture is a fixture whose allowed calls carry an envelope signed
// with envelope/testdata's key-a, under a grant to billing's grant-key-a
// if granted, and a verifier for the billing server.
func envelopeFixture(t *testing.T, ttl time.Duration, granted bool) (*fixture, *envelope.Verifier) {
	t.Helper()
	testdata := filepath.Join("..", "envelope", "testdata")
	keys, r := envelopeKeys(t)
	var grants map[string]*envelope.Recipient
	if granted {
		grants = map[string]*envelope.Recipient{"billing": r}
	}
	f := newFixture(t, func(o *Options) { o.Envelope, o.EnvelopeTTL, o.Grants = keys, ttl, grants })
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(jwks, keys.JWKS(), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := envelope.NewVerifier(envelope.VerifierOptions{Audience: "billing", JWKSFile: jwks, Now: f.clock.now,
		GrantKeyFiles: []string{filepath.Join(testdata, "grant-key-a.pem")}})
	if err != nil {
		t.Fatal(err)
	}
	return f, v
}

// envelopeKeys are envelope/testdata's key-a and the public half of
// grant-key-a, billing's grant key.
func envelopeKeys(t testing.TB) (*envelope.Keys, *envelope.Recipient) {
	t.Helper()
	testdata := filepath.Join("..", "envelope", "testdata")
	keys, err := envelope.LoadKeys(filepath.Join(testdata, "key-a.pem"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := envelope.LoadRecipient(filepath.Join(testdata, "grant-key-a.pub.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return keys, r
}

func presented(o outcome) envelope.Presented {
	return envelope.Presented{Envelope: o.upstream[envelope.Header], Grant: o.upstream[envelope.GrantHeader]}
}

var envelopeModes = []struct {
	name    string
	granted bool
}{{"signed whole", false}, {"under a grant", true}}

// An allowed call's envelope binds exactly what was verified, and verifies
// for that call alone; its audit line names it.
func TestEnvelopeOfAnAllowedCall(t *testing.T) {
	for _, mode := range envelopeModes {
		t.Run(mode.name, func(t *testing.T) { testEnvelopeOfAnAllowedCall(t, mode.granted) })
	}
}

func testEnvelopeOfAnAllowedCall(t *testing.T, granted bool) {
	f, v := envelopeFixture(t, 30*time.Second, granted)
	f.list(t, support, "billing", nil)
	o := f.call(t, checkCase{Principal: support, ServerID: "billing", Body: callBody("refund")})
	if o.reason != "" {
		t.Fatalf("refund denied: %s", o.reason)
	}
	token := presented(o)
	if token.Envelope == "" || (token.Grant != "") != granted {
		t.Fatalf("the allowed call carries %s %q and %s %q", envelope.Header, token.Envelope, envelope.GrantHeader, token.Grant)
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
	if granted && !strings.Contains(f.audit.String(), `"envelope_grant":"`+c.Grant+`"`) {
		t.Errorf("no audit line names grant %s:\n%s", c.Grant, f.audit)
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
	f, _ := envelopeFixture(t, time.Minute, false)
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
		Headers: map[string]string{envelope.Header: "forged", envelope.GrantHeader: "forged"}}.request())
	if err != nil {
		t.Fatal(err)
	}
	ok := resp.GetOkResponse()
	if ok == nil {
		t.Fatal("refund denied")
	}
	for _, name := range []string{envelope.Header, envelope.GrantHeader} {
		for _, h := range ok.GetHeaders() {
			if h.GetHeader().GetKey() == name {
				t.Fatalf("capsnap set %s without keys", name)
			}
		}
		if !slices.Contains(ok.GetHeadersToRemove(), name) {
			t.Fatalf("the client's %s is not removed: %v", name, ok.GetHeadersToRemove())
		}
	}

	fe, _ := envelopeFixture(t, 30*time.Second, false)
	fe.list(t, support, "billing", nil)
	if o := fe.call(t, checkCase{Principal: support, ServerID: "billing", Body: callBody("delete_all_orders")}); o.reason == "" || o.upstream != nil {
		t.Fatalf("a denied call: %+v", o)
	}
}

// Under a grant, capsnap signs once per snapshot and tool: every call of
// refund under one snapshot carries the same grant and its own envelope,
// and another tool or another snapshot another grant. Each envelope
// verifies once, for its own call.
func TestOneGrantPerSnapshotAndTool(t *testing.T) {
	f, v := envelopeFixture(t, 30*time.Second, true)
	f.list(t, support, "billing", nil)
	call := func(tool string) envelope.Presented {
		t.Helper()
		o := f.call(t, checkCase{Principal: support, ServerID: "billing", Body: callBody(tool)})
		if o.reason != "" {
			t.Fatalf("%s denied: %s", tool, o.reason)
		}
		p := presented(o)
		if _, err := v.Verify(p, envelope.Call{Tool: tool, Arguments: json.RawMessage(validArgs[tool])}); err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		return p
	}
	first, second, lookup := call("refund"), call("refund"), call("lookup_order")
	switch {
	case first.Grant != second.Grant:
		t.Error("two calls of refund under one snapshot carry two grants")
	case first.Envelope == second.Envelope:
		t.Error("two calls carry the same envelope")
	case lookup.Grant == first.Grant:
		t.Error("lookup_order and refund share a grant")
	}
	if n := strings.Count(f.audit.String(), `"envelope_grant":"`); n != 3 {
		t.Errorf("%d audit lines name a grant, want 3", n)
	}
	f.list(t, support, "billing", nil)
	if next := call("refund"); next.Grant == first.Grant {
		t.Error("a new snapshot's refund reuses the old snapshot's grant")
	}
}

// A call whose envelope cannot be sealed is denied envelope_failed and is
// not recorded for a sequence rule; a call denied after it was sealed
// carries no envelope, and its audit line names none.
func TestEnvelopeFailedRecordsNothing(t *testing.T) {
	keys, r := envelopeKeys(t)
	f := packFixture(t, func(o *Options) { o.Envelope, o.Grants = keys, map[string]*envelope.Recipient{"billing": r} })
	f.list(t, support, "billing", nil)
	lastLine := func() map[string]any {
		t.Helper()
		lines := strings.Split(strings.TrimSpace(f.audit.String()), "\n")
		var m map[string]any
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	refund := argsCall("refund", `{"order_id":"A-100","amount":40,"reason_code":"damaged"}`)

	f.signer = grantless{keys}
	got := f.call(t, argsCall("lookup_order", lookup))
	if got.reason != deny.EnvelopeFailed || len(got.upstream) != 0 {
		t.Fatalf("lookup_order with no grant: %q, upstream %v", got.reason, got.upstream)
	}
	if line := lastLine(); line["reason"] != string(deny.EnvelopeFailed) || line["envelope"] != nil || line["envelope_grant"] != nil {
		t.Fatalf("audit line %v", line)
	}

	f.signer = keys
	if got := f.call(t, refund); got.reason != deny.SequenceViolation {
		t.Fatalf("refund after a lookup_order that was denied: %q", got.reason)
	}
	if line := lastLine(); line["envelope"] != nil || line["envelope_grant"] != nil {
		t.Fatalf("the audit line of a call denied after its seal names an envelope: %v", line)
	}
	if got := f.call(t, argsCall("lookup_order", lookup)); got.reason != "" || got.upstream[envelope.GrantHeader] == "" {
		t.Fatalf("lookup_order: %q, upstream %v", got.reason, got.upstream)
	}
	if got := f.call(t, refund); got.reason != "" {
		t.Fatalf("refund after lookup_order: %q", got.reason)
	}
}

// A grant kept for the call's server, epoch and tool that says anything
// else (here, another principal's) is never sent: the call gets a grant
// minted for what was verified.
func TestKeptGrantMustSayWhatWasVerified(t *testing.T) {
	f, v := envelopeFixture(t, 30*time.Second, true)
	f.list(t, support, "billing", nil)
	refund := checkCase{Principal: support, ServerID: "billing", Body: callBody("refund")}
	first := f.call(t, refund)
	if first.reason != "" {
		t.Fatalf("refund denied: %s", first.reason)
	}
	k := grantKey{"billing", first.upstream[HeaderEpoch], "refund"}
	kept, ok := f.grants.Load(k)
	if !ok || kept.Token != first.upstream[envelope.GrantHeader] {
		t.Fatal("the call's grant is not kept by server, epoch and tool")
	}
	other := kept.Claims
	other.Subject, other.ID = "spiffe://acme/agent/someone-else", ""
	planted, err := f.signer.Grant(other, f.recipients["billing"])
	if err != nil {
		t.Fatal(err)
	}
	f.grants.Store(k, planted, maxGrants)
	next := f.call(t, refund)
	switch p := presented(next); {
	case next.reason != "":
		t.Fatalf("refund denied: %s", next.reason)
	case p.Grant == planted.Token:
		t.Fatal("a kept grant for another principal was sent")
	default:
		if c, err := v.Verify(p, envelope.Call{Tool: "refund", Arguments: json.RawMessage(validArgs["refund"])}); err != nil || c.Subject != support {
			t.Fatalf("the grant minted again: %+v, %v", c, err)
		}
	}
}

// grantless is a signer whose grant key is gone.
type grantless struct{ *envelope.Keys }

func (grantless) Grant(envelope.GrantClaims, *envelope.Recipient) (*envelope.Grant, error) {
	return nil, errors.New("the grant key is gone")
}
