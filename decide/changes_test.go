package decide

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/tooldiff"
)

var oncall = approval.Approver{ID: "bob@acme.example", Groups: []string{"oncall"}}

// changesFixture is the pack's billing catalog, put under testdata/changes'
// policy (policy file policyFile there) as the operator would by a
// reload, with an approval service on a memory store.
func changesFixture(t *testing.T, policyFile string, opts ...func(*Options)) (*fixture, *approval.Service) {
	t.Helper()
	var svc *approval.Service
	f := newFixture(t, append([]func(*Options){func(o *Options) { svc = serveApprovals(t, o) }}, opts...)...)
	f.billing.push(t, "testdata/pack/catalog.json", nil)
	// The rules that put billing under change control come into force
	// now: what billing lists now is what they first see.
	f.SetRules(mustRules(t, "testdata/changes/"+policyFile))
	return f, svc
}

// listed lists billing as the support agent and returns what was
// delivered and withheld.
func (f *fixture) listed(t *testing.T) (delivered []string, withheld map[string]Withheld) {
	t.Helper()
	resp, err := f.Check(context.Background(), checkCase{Principal: support, ServerID: "billing", Body: listBody}.request())
	if err != nil || resp.GetOkResponse() == nil {
		t.Fatalf("tools/list: %v %v", resp, err)
	}
	out := f.Deliver(listingTicket(t, resp), ResponseHead{Status: 200, ContentType: "application/json"}, f.served(t, "billing", `"l"`))
	if out.Fail != nil {
		t.Fatalf("tools/list response refused: %v", out.Fail)
	}
	withheld = map[string]Withheld{}
	for _, w := range out.Withheld {
		withheld[w.Tool] = w
	}
	for _, name := range []string{"lookup_order", "refund"} {
		if _, ok := withheld[name]; !ok {
			delivered = append(delivered, name)
		}
	}
	return delivered, withheld
}

func (f *fixture) redeploy(t *testing.T, catalog string) {
	t.Helper()
	f.clock.advance(time.Second)
	f.billing.push(t, catalog, nil)
}

// The seed's rug pull under change control: refund gains skip_fraud_check
// and a sentence steering the model to it. The pending call drifts, and
// says what changed; the agent lists again and refund is withheld, its
// call denied tool_under_review with where it is reviewed; lookup_order
// still works. Once the on-call approves, the next listing delivers the
// new refund and it may be called.
func TestChangedToolWaitsForAReviewer(t *testing.T) {
	f, svc := changesFixture(t, "policy.yaml")
	if got, _ := f.listed(t); !slices.Equal(got, []string{"lookup_order", "refund"}) {
		t.Fatalf("first sight delivered %v", got)
	}
	if o := f.call(t, refundOf(40)); o.reason != "" {
		t.Fatalf("refund on its first definition: %s", o.reason)
	}

	f.redeploy(t, "testdata/changes/catalog-skip.json")
	o := f.call(t, refundOf(40))
	if o.reason != deny.SchemaDrift || o.data.Change == nil ||
		!slices.Equal(o.data.Change.Kinds, []string{"description_changed", "property_added"}) ||
		!slices.Contains(o.data.Change.Fields, "inputSchema.properties.skip_fraud_check") {
		t.Fatalf("the pending refund: %s, change %+v", o.reason, o.data.Change)
	}
	if !strings.Contains(f.audit.String(), `"change":{"kinds":["description_changed","property_added"]`) {
		t.Error("the drift's audit line does not say what changed")
	}

	delivered, withheld := f.listed(t)
	if !slices.Equal(delivered, []string{"lookup_order"}) || withheld["refund"].Reason != deny.ToolUnderReview {
		t.Fatalf("after the change: delivered %v, withheld %+v", delivered, withheld)
	}
	o = f.call(t, refundOf(40))
	if o.reason != deny.ToolUnderReview || o.data.Review == nil || o.data.ReturnTo != deny.ReturnToLater {
		t.Fatalf("refund under review: %s, %+v", o.reason, o.data)
	}
	rv := o.data.Review
	if rv.URL != "https://approve.example/approvals/"+rv.ID {
		t.Errorf("data.review %+v", rv)
	}
	if o := f.call(t, argsCall("lookup_order", lookup)); o.reason != "" {
		t.Fatalf("lookup_order while refund is reviewed: %s", o.reason)
	}
	// Listing again, and calling again, wait on the same review.
	f.listed(t)
	if again := f.call(t, refundOf(40)); again.data.Review == nil || again.data.Review.ID != rv.ID {
		t.Fatalf("a second review opened: %+v", again.data.Review)
	}
	req, err := svc.Get(rv.ID)
	if err != nil || req.Change == nil || req.Change.From == "" || !strings.Contains(string(req.Change.Diff), "skip_fraud_check") ||
		!slices.Equal(req.Change.Granted, []string{"id:" + support}) || req.EffectClass != "money_move" {
		t.Fatalf("the review: %+v, %v", req, err)
	}

	if _, err := svc.Decide(rv.ID, oncall, true, "reviewed with billing"); err != nil {
		t.Fatal(err)
	}
	if delivered, _ := f.listed(t); !slices.Equal(delivered, []string{"lookup_order", "refund"}) {
		t.Fatalf("after the approval: delivered %v", delivered)
	}
	if o := f.call(t, argsCall("refund", `{"order_id":"A-100","amount":40,"reason_code":"damaged","skip_fraud_check":false}`)); o.reason != "" {
		t.Fatalf("refund as approved: %s (%s)", o.reason, o.data.Detail)
	}
	if !strings.Contains(f.audit.String(), `"event":"definition_approved","server_id":"billing","tool":"refund"`) ||
		!strings.Contains(f.audit.String(), `"by":"bob@acme.example"`) {
		t.Error("the approval of the definition is not audited")
	}
}

// A rejected change keeps the tool withheld, saying who rejected it and
// why, without a new review per listing; once the server returns to the
// approved definition the tool works again.
func TestRejectedChangeStaysRejectedUntilTheServerReverts(t *testing.T) {
	f, svc := changesFixture(t, "policy.yaml")
	f.listed(t)
	f.redeploy(t, "testdata/changes/catalog-skip.json")
	f.listed(t)
	o := f.call(t, refundOf(40))
	if o.data.Review == nil {
		t.Fatalf("no review: %+v", o)
	}
	if _, err := svc.Decide(o.data.Review.ID, oncall, false, "steers the model past the fraud check"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, withheld := f.listed(t)
		if w := withheld["refund"]; w.Reason != deny.ToolChangeRejected || !strings.Contains(w.Detail, "steers the model past the fraud check") || !strings.Contains(w.Detail, "bob@acme.example") {
			t.Fatalf("after the rejection: %+v", w)
		}
	}
	if o := f.call(t, refundOf(40)); o.reason != deny.ToolChangeRejected {
		t.Fatalf("refund after the rejection: %s", o.reason)
	}
	if all, _ := svc.List(approval.Filter{}); len(all) != 1 {
		t.Fatalf("%d reviews, want the one", len(all))
	}

	f.redeploy(t, "testdata/pack/catalog.json")
	if delivered, _ := f.listed(t); !slices.Equal(delivered, []string{"lookup_order", "refund"}) {
		t.Fatalf("after the revert: delivered %v", delivered)
	}
	if o := f.call(t, refundOf(40)); o.reason != "" {
		t.Fatalf("refund after the revert: %s", o.reason)
	}
}

// A change the policy accepts (a title only) is approved without a
// person, and audited with what changed; any other is not.
func TestPolicyAcceptsATitleOnlyChange(t *testing.T) {
	f, svc := changesFixture(t, "policy.yaml")
	f.listed(t)
	f.redeploy(t, "testdata/changes/catalog-title.json")
	if delivered, _ := f.listed(t); !slices.Equal(delivered, []string{"lookup_order", "refund"}) {
		t.Fatalf("after a title edit: delivered %v", delivered)
	}
	if all, _ := svc.List(approval.Filter{}); len(all) != 0 {
		t.Fatalf("a title edit opened %d reviews", len(all))
	}
	if !strings.Contains(f.audit.String(), `"by":"policy:changes[0]","change":["title_changed"],"fields":["title"]`) {
		t.Errorf("the accepted change is not audited with its diff:\n%s", f.audit)
	}
}

// With first_sight: review, a catalog capsnap has never approved is held
// whole; a server flapping between definitions opens one review per
// distinct definition, not one per listing.
func TestFirstSightReviewAndFlapping(t *testing.T) {
	f, svc := changesFixture(t, "policy-review.yaml")
	delivered, withheld := f.listed(t)
	if len(delivered) != 0 || withheld["refund"].Reason != deny.ToolUnderReview || withheld["lookup_order"].Reason != deny.ToolUnderReview {
		t.Fatalf("first sight under review: delivered %v, withheld %+v", delivered, withheld)
	}
	for range 3 {
		f.redeploy(t, "testdata/changes/catalog-skip.json")
		f.listed(t)
		f.redeploy(t, "testdata/pack/catalog.json")
		f.listed(t)
	}
	all, _ := svc.List(approval.Filter{})
	// lookup_order's one definition, refund's two.
	if len(all) != 3 {
		t.Fatalf("%d reviews after flapping, want 3", len(all))
	}
}

// With the store down, a changed tool is held, never admitted.
func TestChangedToolIsHeldWhileTheStoreIsDown(t *testing.T) {
	var failing *failingStore
	f, _ := changesFixture(t, "policy.yaml", func(o *Options) {
		failing = &failingStore{Memory: o.Snapshots.(*store.Memory)}
		o.Snapshots = failing
	})
	f.listed(t)
	f.redeploy(t, "testdata/changes/catalog-skip.json")
	failing.fail = "ToolStates"
	if _, withheld := f.listed(t); withheld["refund"].Reason != deny.StoreUnavailable {
		t.Fatalf("refund with the store down: %+v", withheld["refund"])
	}
	failing.fail = ""
	if _, withheld := f.listed(t); withheld["refund"].Reason != deny.ToolUnderReview {
		t.Fatalf("refund with the store back: %+v", withheld["refund"])
	}
}

// A change too large to show whole is bounded where a person or a log
// reads it: the review keeps at most approval.MaxChangeDefinition of it,
// a denial and an audit line at most maxFields fields.
func TestChangeIsBounded(t *testing.T) {
	var diff tooldiff.Diff
	for i := range 5000 {
		diff.Changes = append(diff.Changes, tooldiff.Change{Kind: tooldiff.PropertyAdded, Field: fmt.Sprintf("inputSchema.properties.p%04d", i),
			To: json.RawMessage(`{"type":"string","description":"` + strings.Repeat("x", 100) + `"}`)})
	}
	raw, err := boundedDiff(diff)
	if err != nil || len(raw) > approval.MaxChangeDefinition || !strings.Contains(string(raw), `"inputSchema.properties.p0000"`) {
		t.Fatalf("bounded diff of %d bytes (%v)", len(raw), err)
	}
	if fields := boundedFields(diff.Fields()); len(fields) != maxFields || fields[maxFields-1] != "(and 4937 more)" {
		t.Fatalf("bounded fields: %d, last %q", len(fields), fields[len(fields)-1])
	}
	small := tooldiff.Diff{Changes: diff.Changes[:2]}
	if raw, _ := boundedDiff(small); !strings.Contains(string(raw), "xxxx") {
		t.Error("a small diff lost its values")
	}
}

// A tool the server removes is audited, and keeps its approved
// definition: coming back changed, it is a change to review, not a tool
// seen for the first time.
func TestRemovedToolComesBackAsAChange(t *testing.T) {
	f, _ := changesFixture(t, "policy.yaml")
	f.listed(t)
	f.redeploy(t, "testdata/changes/catalog-no-refund.json")
	if !strings.Contains(f.audit.String(), `"event":"definition_removed","server_id":"billing","tool":"refund"`) {
		t.Errorf("the removal is not audited:\n%s", f.audit)
	}
	f.redeploy(t, "testdata/changes/catalog-skip.json")
	if _, withheld := f.listed(t); withheld["refund"].Reason != deny.ToolUnderReview {
		t.Fatalf("refund back with skip_fraud_check: %+v", withheld["refund"])
	}
}

// A server cycling through ever new definitions of a tool opens at most
// store.MaxReviewing reviews; past that the tool stays held, with none.
func TestReviewsPerToolAreBounded(t *testing.T) {
	f, svc := changesFixture(t, "policy.yaml")
	f.listed(t)
	base, err := os.ReadFile("testdata/pack/catalog.json")
	if err != nil {
		t.Fatal(err)
	}
	for i := range store.MaxReviewing + 3 {
		path := filepath.Join(t.TempDir(), "catalog.json")
		edited := strings.Replace(string(base), "Refund part or all of an order, in USD.", fmt.Sprintf("Refund part or all of an order, in USD, version %d.", i), 1)
		if err := os.WriteFile(path, []byte(edited), 0o644); err != nil {
			t.Fatal(err)
		}
		f.redeploy(t, path)
		_, withheld := f.listed(t)
		if w := withheld["refund"]; w.Reason != deny.ToolUnderReview {
			t.Fatalf("version %d: %+v", i, w)
		}
	}
	all, _ := svc.List(approval.Filter{})
	if len(all) != store.MaxReviewing {
		t.Fatalf("%d reviews opened, want %d", len(all), store.MaxReviewing)
	}
	if o := f.call(t, refundOf(40)); o.reason != deny.ToolUnderReview || o.data.Review != nil || !strings.Contains(o.data.Detail, "already wait for a reviewer") {
		t.Fatalf("past the bound: %s, %+v", o.reason, o.data)
	}
}
