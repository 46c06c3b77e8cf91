// The approvals' part of the contract: the memory store of one replica and
// the Redis store replicas share are held to the same one, so that an
// approval means the same whichever store holds it.

package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/capsnap/capsnap/approval"
)

// Retain is how long past its Expires the backends under test keep an
// approval request: Open must make backends that keep them this long.
const Retain = time.Hour

// runApprovals runs the approvals' part against the backends open makes.
func runApprovals(t *testing.T, open Open) {
	tests := []struct {
		name string
		fn   func(*testing.T, approval.Store)
	}{
		{"OpenIsOnePerBinding", openIsOnePerBinding},
		{"OpenRefusesAnInvalidRequest", openRefusesAnInvalidRequest},
		{"GetReturnsWhatWasOpened", getReturnsWhatWasOpened},
		{"ListFiltersNewestFirst", listFiltersNewestFirst},
		{"DecideKeepsTheRules", decideKeepsTheRules},
		{"ApprovalLivesItsTTL", approvalLivesItsTTL},
		{"ConsumeIsSingleUseAndExact", consumeIsSingleUseAndExact},
		{"ARequestAfterTheLastOneEnds", aRequestAfterTheLastOneEnds},
		{"ARejectedChangeHoldsItsBinding", aRejectedChangeHoldsItsBinding},
		{"ADenialStandsItsTime", aDenialStandsItsTime},
		{"ExpireMarksEachOnce", expireMarksEachOnce},
		{"RequestsAreForgottenAfterRetain", requestsAreForgottenAfterRetain},
		{"RacesHaveOneWinner", racesHaveOneWinner},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t, nil).Approvals()) })
	}
}

// Binding returns a complete binding for principal, with args as its
// arguments' digest.
func Binding(principal, args string) approval.Binding {
	return approval.Binding{
		Principal: principal, Server: "billing", Tool: "refund",
		SchemaDigest: "sha256:5c", PolicyDigest: "sha256:9d", ArgsDigest: args,
	}
}

// Request returns a pending request for b opened at now: approvers the
// identity "alice@acme.example" and the group "billing-oncall", pending for
// 15 minutes, approvals living 5.
func Request(b approval.Binding, now time.Time) approval.Request {
	return approval.Request{
		ID: approval.NewID(), Binding: b,
		Arguments:   json.RawMessage(`{"order_id": "A-100", "amount": 240, "note": "<script>alert(1)</script>"}`),
		EffectClass: "money_move", Rule: `tools.refund.approval (args.amount > 100)`,
		Approvers:   []string{"alice@acme.example", "group:billing-oncall"},
		ApprovalTTL: 5 * time.Minute, Created: now, Expires: now.Add(15 * time.Minute), State: approval.Pending,
	}
}

var (
	alice  = approval.Approver{ID: "alice@acme.example"}
	oncall = approval.Approver{ID: "bob@acme.example", Groups: []string{"staff", "billing-oncall"}}
	carol  = approval.Approver{ID: "carol@acme.example", Groups: []string{"staff"}}
)

// base is a fixed moment near now, truncated so that every store's
// encoding of times holds it exactly.
func base() time.Time { return time.Now().Truncate(time.Millisecond) }

func mustOpen(t *testing.T, st approval.Store, req approval.Request, now time.Time) approval.Request {
	t.Helper()
	r, opened, err := st.Open(req, now)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if !opened || r.ID != req.ID {
		t.Fatalf("Open = %s, opened %v; want the new request %s opened", r.ID, opened, req.ID)
	}
	return r
}

func mustDecide(t *testing.T, st approval.Store, id string, by approval.Approver, approve bool, now time.Time) approval.Request {
	t.Helper()
	r, err := st.Decide(id, by, approve, "checked the order", now)
	if err != nil {
		t.Fatalf("Decide(%s, %s, %v): %v", id, by.ID, approve, err)
	}
	return r
}

func openIsOnePerBinding(t *testing.T, st approval.Store) {
	now := base()
	b := Binding("spiffe://acme/agent/support", "sha256:a1")
	first := mustOpen(t, st, Request(b, now), now)
	again, opened, err := st.Open(Request(b, now.Add(time.Second)), now.Add(time.Second))
	if err != nil || opened || again.ID != first.ID {
		t.Fatalf("the same binding again: %s, opened %v, %v; want %s, not opened", again.ID, opened, err, first.ID)
	}
	mustDecide(t, st, first.ID, alice, true, now.Add(2*time.Second))
	again, opened, err = st.Open(Request(b, now.Add(3*time.Second)), now.Add(3*time.Second))
	if err != nil || opened || again.ID != first.ID || again.State != approval.Approved {
		t.Fatalf("the same binding, approved: %s %s, opened %v, %v; want the approval %s", again.ID, again.State, opened, err, first.ID)
	}
	for _, other := range []approval.Binding{
		Binding("spiffe://acme/agent/support", "sha256:a2"),
		Binding("spiffe://acme/agent/other", "sha256:a1"),
		func() approval.Binding { o := b; o.SchemaDigest = "sha256:5d"; return o }(),
		func() approval.Binding { o := b; o.PolicyDigest = "sha256:9e"; return o }(),
		func() approval.Binding { o := b; o.Tool = "refund_v2"; return o }(),
		func() approval.Binding { o := b; o.Server = "ledger"; return o }(),
	} {
		r := mustOpen(t, st, Request(other, now), now)
		if r.ID == first.ID {
			t.Fatalf("binding %+v shares the request of %+v", other, b)
		}
	}
}

func openRefusesAnInvalidRequest(t *testing.T, st approval.Store) {
	now := base()
	ok := Request(Binding("p", "sha256:a1"), now)
	for name, edit := range map[string]func(*approval.Request){
		"forged id":         func(r *approval.Request) { r.ID = "../../etc/passwd" },
		"incomplete":        func(r *approval.Request) { r.Binding.ArgsDigest = "" },
		"no approver":       func(r *approval.Request) { r.Approvers = nil },
		"no approval ttl":   func(r *approval.Request) { r.ApprovalTTL = 0 },
		"opened approved":   func(r *approval.Request) { r.State = approval.Approved },
		"expired already":   func(r *approval.Request) { r.Expires = now },
		"expires in a past": func(r *approval.Request) { r.Expires = now.Add(-time.Minute) },
	} {
		r := ok
		r.Approvers = append([]string(nil), ok.Approvers...)
		edit(&r)
		if _, _, err := st.Open(r, now); err == nil {
			t.Errorf("%s: opened", name)
		}
	}
	if _, err := st.Get(ok.ID, now); !errors.Is(err, approval.ErrNotFound) {
		t.Fatalf("a refused request is stored: %v", err)
	}
}

func getReturnsWhatWasOpened(t *testing.T, st approval.Store) {
	now := base()
	req := Request(Binding("spiffe://acme/agent/support", "sha256:a1"), now)
	req.SelfApprove = true
	mustOpen(t, st, req, now)
	got, err := st.Get(req.ID, now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	SameRequest(t, got, req)
	for _, id := range []string{approval.NewID(), "", "not-an-id"} {
		if _, err := st.Get(id, now); !errors.Is(err, approval.ErrNotFound) {
			t.Errorf("Get(%q) = %v, want ErrNotFound", id, err)
		}
	}
}

// SameRequest fails the test unless got is want as stored: every field, the
// arguments byte for byte, the times to the millisecond.
func SameRequest(t *testing.T, got, want approval.Request) {
	t.Helper()
	eq := func(a, b time.Time) bool { return a.Equal(b) }
	switch {
	case got.ID != want.ID || got.Binding != want.Binding || string(got.Arguments) != string(want.Arguments) ||
		got.EffectClass != want.EffectClass || got.Rule != want.Rule || !reflect.DeepEqual(got.Approvers, want.Approvers) ||
		got.SelfApprove != want.SelfApprove || got.ApprovalTTL != want.ApprovalTTL || got.State != want.State ||
		got.DecidedBy != want.DecidedBy || got.Reason != want.Reason:
		t.Fatalf("request read back as\n%+v\nstored\n%+v", got, want)
	case !eq(got.Created, want.Created) || !eq(got.Expires, want.Expires) || !eq(got.DecidedAt, want.DecidedAt):
		t.Fatalf("request %s times read back as %s, %s, %s; stored %s, %s, %s", want.ID,
			got.Created, got.Expires, got.DecidedAt, want.Created, want.Expires, want.DecidedAt)
	}
}

func ids(rs []approval.Request) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

func listFiltersNewestFirst(t *testing.T, st approval.Store) {
	now := base()
	a := mustOpen(t, st, Request(Binding("agent-a", "sha256:01"), now), now)
	b := mustOpen(t, st, Request(Binding("agent-b", "sha256:02"), now.Add(time.Second)), now.Add(time.Second))
	c := mustOpen(t, st, Request(Binding("agent-a", "sha256:03"), now.Add(2*time.Second)), now.Add(2*time.Second))
	mustDecide(t, st, b.ID, oncall, false, now.Add(3*time.Second))
	at := now.Add(4 * time.Second)
	for _, tc := range []struct {
		f    approval.Filter
		want []string
	}{
		{approval.Filter{}, []string{c.ID, b.ID, a.ID}},
		{approval.Filter{State: approval.Pending}, []string{c.ID, a.ID}},
		{approval.Filter{State: approval.Denied}, []string{b.ID}},
		{approval.Filter{Principal: "agent-a"}, []string{c.ID, a.ID}},
		{approval.Filter{State: approval.Denied, Principal: "agent-a"}, []string{}},
	} {
		got, err := st.List(tc.f, at)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ids(got), tc.want) {
			t.Errorf("List(%+v) = %v, want %v", tc.f, ids(got), tc.want)
		}
	}
	// A lapsed request is listed as expired before any sweep marks it.
	got, err := st.List(approval.Filter{State: approval.Expired}, now.Add(time.Hour))
	if err != nil || !reflect.DeepEqual(ids(got), []string{c.ID, a.ID}) {
		t.Fatalf("List(expired) an hour later = %v, %v; want %v", ids(got), err, []string{c.ID, a.ID})
	}
}

func decideKeepsTheRules(t *testing.T, st approval.Store) {
	now := base()
	open := func(principal string, self bool) approval.Request {
		req := Request(Binding(principal, approval.NewID()), now)
		req.SelfApprove = self
		return mustOpen(t, st, req, now)
	}
	tests := []struct {
		name    string
		req     approval.Request
		by      approval.Approver
		approve bool
		at      time.Time
		want    error
	}{
		{"an approver by identity", open("agent", false), alice, true, now, nil},
		{"an approver by group", open("agent", false), oncall, true, now, nil},
		{"an approver denies", open("agent", false), alice, false, now, nil},
		{"outside the rule", open("agent", false), carol, true, now, approval.ErrNotApprover},
		{"outside the rule denies", open("agent", false), carol, false, now, approval.ErrNotApprover},
		{"no identity", open("agent", false), approval.Approver{Groups: []string{"billing-oncall"}}, true, now, approval.ErrNotApprover},
		{"the requester approves its own call", open(alice.ID, false), alice, true, now, approval.ErrSelfApproval},
		{"the requester denies its own call", open(alice.ID, false), alice, false, now, nil},
		{"the requester may approve its own", open(alice.ID, true), alice, true, now, nil},
		{"too late", open("agent", false), alice, true, now.Add(15 * time.Minute), approval.ErrExpired},
		{"too late, outside the rule", open("agent", false), carol, true, now.Add(time.Hour), approval.ErrNotApprover},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := st.Decide(tt.req.ID, tt.by, tt.approve, "looked at it", tt.at)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Decide = %v, want %v", err, tt.want)
			}
			stored, gerr := st.Get(tt.req.ID, tt.at)
			if gerr != nil {
				t.Fatal(gerr)
			}
			if err != nil {
				if want := tt.req.At(tt.at).State; stored.State != want {
					t.Fatalf("a refused decision left the request %s, want %s", stored.State, want)
				}
				return
			}
			want := approval.Denied
			if tt.approve {
				want = approval.Approved
			}
			if got.State != want || got.DecidedBy != tt.by.ID || !got.DecidedAt.Equal(tt.at) || got.Reason != "looked at it" {
				t.Fatalf("decided %+v", got)
			}
			SameRequest(t, stored, got)
			if _, err := st.Decide(tt.req.ID, oncall, !tt.approve, "", tt.at); !errors.Is(err, approval.ErrDecided) {
				t.Fatalf("decided twice: %v", err)
			}
		})
	}
	if _, err := st.Decide(approval.NewID(), alice, true, "", now); !errors.Is(err, approval.ErrNotFound) {
		t.Fatalf("Decide of an unknown id = %v", err)
	}
}

func approvalLivesItsTTL(t *testing.T, st approval.Store) {
	now := base()
	b := Binding("agent", "sha256:a1")
	r := mustOpen(t, st, Request(b, now), now)
	at := now.Add(14 * time.Minute) // a minute before the request lapses
	got := mustDecide(t, st, r.ID, alice, true, at)
	if want := at.Add(r.ApprovalTTL); !got.Expires.Equal(want) {
		t.Fatalf("approved at %s, expires %s; want %s", at, got.Expires, want)
	}
	if _, ok, err := st.Consume(b, at.Add(r.ApprovalTTL)); ok || err != nil {
		t.Fatalf("consumed at its expiry: %v, %v", ok, err)
	}
	if _, ok, err := st.Consume(b, at.Add(r.ApprovalTTL-time.Millisecond)); !ok || err != nil {
		t.Fatalf("not consumed just before its expiry, past the request's: %v, %v", ok, err)
	}
}

func consumeIsSingleUseAndExact(t *testing.T, st approval.Store) {
	now := base()
	b := Binding("spiffe://acme/agent/support", "sha256:a1")
	r := mustOpen(t, st, Request(b, now), now)
	if _, ok, err := st.Consume(b, now); ok || err != nil {
		t.Fatalf("a pending request consumed: %v, %v", ok, err)
	}
	mustDecide(t, st, r.ID, oncall, true, now.Add(time.Second))
	for name, other := range map[string]approval.Binding{
		"other arguments":        Binding("spiffe://acme/agent/support", "sha256:a2"),
		"another principal":      Binding("spiffe://acme/agent/other", "sha256:a1"),
		"another tool":           func() approval.Binding { o := b; o.Tool = "refund_v2"; return o }(),
		"another server":         func() approval.Binding { o := b; o.Server = "ledger"; return o }(),
		"another schema digest":  func() approval.Binding { o := b; o.SchemaDigest = "sha256:5d"; return o }(),
		"another policy digest":  func() approval.Binding { o := b; o.PolicyDigest = "sha256:9e"; return o }(),
		"nothing but the digest": {ArgsDigest: b.ArgsDigest},
	} {
		if _, ok, err := st.Consume(other, now.Add(2*time.Second)); ok || err != nil {
			t.Errorf("%s consumed the approval: %v, %v", name, ok, err)
		}
	}
	got, ok, err := st.Consume(b, now.Add(2*time.Second))
	if err != nil || !ok || got.ID != r.ID || got.State != approval.Consumed || got.DecidedBy != oncall.ID {
		t.Fatalf("Consume = %+v, %v, %v", got, ok, err)
	}
	if _, ok, err := st.Consume(b, now.Add(3*time.Second)); ok || err != nil {
		t.Fatalf("consumed twice: %v, %v", ok, err)
	}
	if stored, err := st.Get(r.ID, now.Add(3*time.Second)); err != nil || stored.State != approval.Consumed {
		t.Fatalf("stored as %s, %v", stored.State, err)
	}
	// A denied request is no approval.
	d := mustOpen(t, st, Request(Binding("agent", "sha256:d1"), now), now)
	mustDecide(t, st, d.ID, alice, false, now)
	if _, ok, err := st.Consume(d.Binding, now); ok || err != nil {
		t.Fatalf("a denial consumed: %v, %v", ok, err)
	}
}

func aRequestAfterTheLastOneEnds(t *testing.T, st approval.Store) {
	now := base()
	for _, end := range []string{"denied", "consumed", "expired pending", "expired approval"} {
		t.Run(end, func(t *testing.T) {
			b := Binding("agent", approval.NewID())
			r := mustOpen(t, st, Request(b, now), now)
			at := now.Add(time.Second)
			switch end {
			case "denied":
				mustDecide(t, st, r.ID, alice, false, now)
			case "consumed":
				mustDecide(t, st, r.ID, alice, true, now)
				if _, ok, err := st.Consume(b, now); !ok || err != nil {
					t.Fatal(ok, err)
				}
			case "expired pending":
				at = r.Expires
			case "expired approval":
				mustDecide(t, st, r.ID, alice, true, now)
				at = now.Add(r.ApprovalTTL)
			}
			next := mustOpen(t, st, Request(b, at), at)
			if next.ID == r.ID {
				t.Fatalf("the %s request was opened again", end)
			}
		})
	}
}

func expireMarksEachOnce(t *testing.T, st approval.Store) {
	now := base()
	pending := mustOpen(t, st, Request(Binding("agent", "sha256:01"), now), now)
	approved := mustOpen(t, st, Request(Binding("agent", "sha256:02"), now), now)
	mustDecide(t, st, approved.ID, alice, true, now.Add(12*time.Minute)) // lives until 17 min
	denied := mustOpen(t, st, Request(Binding("agent", "sha256:03"), now), now)
	mustDecide(t, st, denied.ID, alice, false, now)

	if got, err := st.Expire(now.Add(14 * time.Minute)); err != nil || len(got) != 0 {
		t.Fatalf("Expire before anything lapsed = %v, %v", ids(got), err)
	}
	got, err := st.Expire(now.Add(15 * time.Minute))
	if err != nil || !reflect.DeepEqual(ids(got), []string{pending.ID}) || got[0].State != approval.Expired {
		t.Fatalf("Expire at 15 min = %v, %v; want %s expired", ids(got), err, pending.ID)
	}
	if got, err := st.Expire(now.Add(16 * time.Minute)); err != nil || len(got) != 0 {
		t.Fatalf("Expire again = %v, %v", ids(got), err)
	}
	got, err = st.Expire(now.Add(17 * time.Minute))
	if err != nil || !reflect.DeepEqual(ids(got), []string{approved.ID}) {
		t.Fatalf("Expire at 17 min = %v, %v; want the approval %s", ids(got), err, approved.ID)
	}
	for _, r := range []approval.Request{pending, approved} {
		if s, err := st.Get(r.ID, now); err != nil || s.State != approval.Expired {
			t.Fatalf("%s stored as %s, %v; want expired, also read at an earlier now", r.ID, s.State, err)
		}
	}
	if _, err := st.Decide(pending.ID, alice, true, "", now); !errors.Is(err, approval.ErrExpired) {
		t.Fatalf("Decide of an expired request = %v", err)
	}
	if s, err := st.Get(denied.ID, now.Add(time.Hour)); err != nil || s.State != approval.Denied {
		t.Fatalf("the denial read as %s, %v", s.State, err)
	}
}

func requestsAreForgottenAfterRetain(t *testing.T, st approval.Store) {
	now := base()
	r := mustOpen(t, st, Request(Binding("agent", "sha256:01"), now), now)
	if _, err := st.Expire(r.Expires.Add(Retain)); err != nil {
		t.Fatal(err)
	}
	if s, err := st.Get(r.ID, r.Expires.Add(Retain)); err != nil || s.State != approval.Expired {
		t.Fatalf("forgotten too soon: %s, %v", s.State, err)
	}
	if _, err := st.Expire(r.Expires.Add(Retain + time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(r.ID, now); !errors.Is(err, approval.ErrNotFound) {
		t.Fatalf("kept past Retain: %v", err)
	}
	if got, err := st.List(approval.Filter{}, now); err != nil || len(got) != 0 {
		t.Fatalf("listed past Retain: %v, %v", ids(got), err)
	}
}

func racesHaveOneWinner(t *testing.T, st approval.Store) {
	const n = 8
	now := base()
	race := func(f func(i int) bool) int {
		var wg sync.WaitGroup
		var mu sync.Mutex
		won := 0
		for i := range n {
			wg.Go(func() {
				if f(i) {
					mu.Lock()
					won++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return won
	}
	b := Binding("agent", "sha256:race")
	var mu sync.Mutex
	seen := map[string]bool{}
	if won := race(func(int) bool {
		r, opened, err := st.Open(Request(b, now), now)
		if err != nil {
			t.Error(err)
			return false
		}
		mu.Lock()
		seen[r.ID] = true
		mu.Unlock()
		return opened
	}); won != 1 || len(seen) != 1 {
		t.Fatalf("%d racing Opens of one binding opened %d requests, answered %d ids; want 1", n, won, len(seen))
	}
	var id string
	for id = range seen {
	}
	if won := race(func(i int) bool {
		_, err := st.Decide(id, alice, i%2 == 0, fmt.Sprint(i), now)
		if err != nil && !errors.Is(err, approval.ErrDecided) {
			t.Error(err)
		}
		return err == nil
	}); won != 1 {
		t.Fatalf("%d racing Decides: %d decided, want 1", n, won)
	}
	r, err := st.Get(id, now)
	if err != nil {
		t.Fatal(err)
	}
	if r.State == approval.Denied {
		if _, err := st.Decide(mustOpen(t, st, Request(b, now), now).ID, alice, true, "", now); err != nil {
			t.Fatal(err)
		}
	}
	if won := race(func(int) bool {
		_, ok, err := st.Consume(b, now)
		if err != nil {
			t.Error(err)
		}
		return ok
	}); won != 1 {
		t.Fatalf("%d racing Consumes of one approval: %d consumed it, want 1", n, won)
	}
}

// Review returns a pending review of a change of billing/refund to digest.
func Review(to string, now time.Time) approval.Request {
	r := Request(approval.Binding{Principal: approval.ChangeReviewer, Server: "billing", Tool: "refund",
		SchemaDigest: to, PolicyDigest: "sha256:01", ArgsDigest: "change"}, now)
	r.Arguments = nil
	r.Change = &approval.Change{From: "sha256:01", To: to, Diff: json.RawMessage(`{"changes":[{"kind":"property_added","field":"inputSchema.properties.skip_fraud_check"}]}`),
		Definition: `{"name":"refund"}`, Granted: []string{"id:agent"}, Wait: time.Hour}
	return r
}

// A rejected review of a change holds its binding: the server listing the
// rejected definition again gets the rejection, with its reason, not a
// new review. A rejected call does not (aRequestAfterTheLastOneEnds).
func aRejectedChangeHoldsItsBinding(t *testing.T, st approval.Store) {
	now := base()
	r := mustOpen(t, st, Review("sha256:"+approval.NewID(), now), now)
	if _, err := st.Decide(r.ID, alice, false, "it steers the model past the fraud check", now); err != nil {
		t.Fatal(err)
	}
	at := now.Add(time.Hour)
	again, opened, err := st.Open(Review(r.Binding.SchemaDigest, at), at)
	if err != nil || opened || again.ID != r.ID || again.State != approval.Denied || again.Reason != "it steers the model past the fraud check" {
		t.Fatalf("the rejected change opened again: %+v, opened %v, %v", again, opened, err)
	}
	if again.Change == nil || again.Change.To != r.Binding.SchemaDigest || string(again.Change.Diff) != string(r.Change.Diff) || again.Change.Wait != time.Hour {
		t.Fatalf("the change was not kept: %+v", again.Change)
	}
	// The API answers with it as JSON: a review's arguments are none.
	if _, err := json.Marshal(again); err != nil {
		t.Fatalf("the review as stored is no JSON: %v", err)
	}
}

// A held call a person denied holds its binding for DeniedFor after the
// decision: the identical call gets the denial, with its reason, not a
// new request; after it, a new request opens.
func aDenialStandsItsTime(t *testing.T, st approval.Store) {
	now := base()
	b := Binding("agent", approval.NewID())
	req := Request(b, now)
	req.DeniedFor = 10 * time.Minute
	r := mustOpen(t, st, req, now)
	mustDecide(t, st, r.ID, alice, false, now)
	at := now.Add(10*time.Minute - time.Millisecond)
	again, opened, err := st.Open(Request(b, at), at)
	if err != nil || opened || again.ID != r.ID || again.State != approval.Denied || again.Reason != "checked the order" || again.DeniedFor != 10*time.Minute {
		t.Fatalf("within the denial: %+v, opened %v, %v", again, opened, err)
	}
	at = now.Add(10 * time.Minute)
	if next := mustOpen(t, st, Request(b, at), at); next.ID == r.ID {
		t.Fatal("the denial stood past its time")
	}
}
