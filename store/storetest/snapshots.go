// The snapshots' part of the contract: snapshots, invalidations, the calls
// logged under a snapshot, and the listings redeemed.

package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// runSnapshots runs the snapshots' part against the backends open makes.
func runSnapshots(t *testing.T, open Open) {
	tests := []struct {
		name string
		fn   func(*testing.T, Store)
	}{
		{"SnapshotHoldsTheWholeTuple", snapshotHoldsTheWholeTuple},
		{"LatestPerPrincipalServerSession", latestPerPrincipalServerSession},
		{"ExpiredSnapshotIsRefused", expiredSnapshotIsRefused},
		{"LargeSnapshotKeepsEveryPin", largeSnapshotKeepsEveryPin},
		{"InvalidationsAreSequenced", invalidationsAreSequenced},
		{"CallsAreRecordedPerSnapshot", callsAreRecordedPerSnapshot},
		{"SequenceRulesNeedEveryPredecessor", sequenceRulesNeedEveryPredecessor},
		{"SnapshotIsItsCallLog", snapshotIsItsCallLog},
		{"RedemptionsAreKeptForTheirTime", redemptionsAreKeptForTheirTime},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t, nil)) })
	}
}

// Snapshot returns an unstored snapshot valid for ttl from now.
func Snapshot(principal, server, session string, ttl time.Duration, pins ...store.Pin) *store.Snapshot {
	now := time.Now()
	return &store.Snapshot{Epoch: store.NewEpoch(), Principal: principal, ServerID: server, Session: session,
		ObservedAt: now, ValidUntil: now.Add(ttl), Pins: pins}
}

// Put stores s or fails the test.
func Put(t *testing.T, st store.Snapshots, s *store.Snapshot) {
	t.Helper()
	if err := st.Put(s); err != nil {
		t.Fatalf("Put %s: %v", s.Epoch, err)
	}
}

// Same fails the test unless got is want as stored: every field a decision
// reads, whatever the store's encoding.
func Same(t *testing.T, got, want *store.Snapshot) {
	t.Helper()
	switch {
	case got == nil:
		t.Fatalf("snapshot %s not found", want.Epoch)
	case got.Epoch != want.Epoch || got.Principal != want.Principal || got.ServerID != want.ServerID ||
		got.Session != want.Session || got.NextCursor != want.NextCursor || got.Seq != want.Seq:
		t.Fatalf("snapshot read back as %+v, stored %+v", got, want)
	case !got.ValidUntil.Equal(want.ValidUntil) || !got.ObservedAt.Equal(want.ObservedAt):
		t.Fatalf("snapshot %s times read back as %s..%s, stored %s..%s", want.Epoch, got.ObservedAt, got.ValidUntil, want.ObservedAt, want.ValidUntil)
	case !slices.Equal(got.Pins, want.Pins):
		t.Fatalf("snapshot %s pins read back as %+v, stored %+v", want.Epoch, got.Pins, want.Pins)
	}
}

func snapshotHoldsTheWholeTuple(t *testing.T, st Store) {
	refund := store.Pin{ToolID: "refund", SchemaDigest: "sha256:aa", Effect: policy.MoneyMove, PolicyDigest: "sha256:pp", Seq: 3}
	lookup := store.Pin{ToolID: "lookup_order", SchemaDigest: "sha256:bb", Effect: policy.Read, PolicyDigest: "sha256:qq", Seq: 2}
	s := Snapshot("agent-a", "billing", "sess-1", time.Minute, refund, lookup)
	s.NextCursor, s.Seq = "page-2", 3
	Put(t, st, s)
	got, ok, err := st.ByEpoch(s.Epoch)
	if err != nil || !ok {
		t.Fatalf("ByEpoch = %v, %v", ok, err)
	}
	Same(t, got, s)
	if p, ok := got.Pin("refund"); !ok || p != refund {
		t.Fatalf("Pin(refund) = %+v, %v", p, ok)
	}
	if _, ok := got.Pin("create_invoice"); ok {
		t.Error("found a pin for a tool the snapshot does not pin")
	}
	if _, ok, err := st.ByEpoch(store.NewEpoch()); ok || err != nil {
		t.Errorf("ByEpoch(another epoch) = %v, %v; want not found", ok, err)
	}
}

func latestPerPrincipalServerSession(t *testing.T, st Store) {
	first := Snapshot("a", "billing", "s1", time.Minute)
	second := Snapshot("a", "billing", "s1", time.Minute)
	other := Snapshot("a", "billing", "s2", time.Minute)
	for _, s := range []*store.Snapshot{first, second, other} {
		Put(t, st, s)
	}
	latest := func(p, srv, sess string) *store.Snapshot {
		t.Helper()
		got, ok, err := st.Latest(p, srv, sess)
		if err != nil || ok != (got != nil) {
			t.Fatalf("Latest(%s, %s, %s) = %v, %v, %v", p, srv, sess, got, ok, err)
		}
		return got
	}
	Same(t, latest("a", "billing", "s1"), second)
	Same(t, latest("a", "billing", "s2"), other)
	for _, k := range [][3]string{{"b", "billing", "s1"}, {"a", "payments", "s1"}, {"a", "billing", ""}} {
		if got := latest(k[0], k[1], k[2]); got != nil {
			t.Errorf("Latest%v = %s, want none", k, got.Epoch)
		}
	}
	any, ok, err := st.LatestInAnySession("a", "billing")
	if err != nil || !ok {
		t.Fatalf("LatestInAnySession = %v, %v", ok, err)
	}
	Same(t, any, other)
	if _, ok, err := st.LatestInAnySession("a", "payments"); ok || err != nil {
		t.Errorf("LatestInAnySession(payments) = %v, %v; want none", ok, err)
	}
	// An older snapshot stays findable by its epoch.
	if _, ok, err := st.ByEpoch(first.Epoch); !ok || err != nil {
		t.Errorf("ByEpoch(first) = %v, %v", ok, err)
	}
}

func expiredSnapshotIsRefused(t *testing.T, st Store) {
	if err := st.Put(Snapshot("a", "billing", "", -time.Second)); err == nil {
		t.Fatal("Put accepted an expired snapshot")
	}
}

func largeSnapshotKeepsEveryPin(t *testing.T, st Store) {
	var pins []store.Pin
	for i := range 5000 {
		pins = append(pins, store.Pin{ToolID: fmt.Sprintf("tool_%04d", i), SchemaDigest: "sha256:aa", Effect: policy.Read})
	}
	s := Snapshot("a", "billing", "", time.Minute, pins...)
	Put(t, st, s)
	got, ok, err := st.ByEpoch(s.Epoch)
	if err != nil || !ok {
		t.Fatalf("ByEpoch = %v, %v", ok, err)
	}
	for _, p := range pins {
		if q, ok := got.Pin(p.ToolID); !ok || q != p {
			t.Fatalf("lost the pin of %s: %+v", p.ToolID, q)
		}
	}
}

// A pin confirmed at sequence n is void once its tool changes at a later
// one; the sequence only grows.
func invalidationsAreSequenced(t *testing.T, st Store) {
	seq := func() uint64 {
		t.Helper()
		n, err := st.Seq()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	at := func(server, tool string) uint64 {
		t.Helper()
		n, err := st.ChangedAt(server, tool)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	pinned := seq()
	if got := at("billing", "refund"); got > pinned {
		t.Fatalf("refund changed at %d in a new store, after the sequence %d", got, pinned)
	}
	if err := st.Invalidate("billing", []string{"refund", "lookup_order"}); err != nil {
		t.Fatal(err)
	}
	first := seq()
	if first <= pinned {
		t.Fatalf("Seq did not grow: %d, then %d", pinned, first)
	}
	for _, tool := range []string{"refund", "lookup_order"} {
		if got := at("billing", tool); got != first {
			t.Errorf("ChangedAt(billing, %s) = %d, want %d", tool, got, first)
		}
	}
	if got := at("billing", "create_invoice"); got > pinned {
		t.Errorf("an unchanged tool changed at %d", got)
	}
	if got := at("payments", "refund"); got > pinned {
		t.Errorf("another server's tool of the same name changed at %d", got)
	}
	if err := st.Invalidate("billing", []string{"refund"}); err != nil {
		t.Fatal(err)
	}
	if second := seq(); second <= first || at("billing", "refund") != second || at("billing", "lookup_order") != first {
		t.Errorf("after a second change: Seq %d, refund at %d, lookup_order at %d", second, at("billing", "refund"), at("billing", "lookup_order"))
	}
}

func callsAreRecordedPerSnapshot(t *testing.T, st Store) {
	a := Snapshot("a", "billing", "", time.Minute)
	b := Snapshot("a", "billing", "", time.Minute)
	Put(t, st, a)
	Put(t, st, b)
	follows := func(s *store.Snapshot, tool string, after []string, record bool) bool {
		t.Helper()
		ok, err := st.Follows(s, tool, after, record)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	lookup := []string{"lookup_order"}
	if follows(a, "refund", lookup, false) {
		t.Fatal("a sequence rule held before any call was made")
	}
	if !follows(a, "lookup_order", nil, false) {
		t.Fatal("a call with no sequence rule did not follow")
	}
	if follows(a, "refund", lookup, false) {
		t.Fatal("a call not asked to be recorded was recorded")
	}
	if !follows(a, "lookup_order", nil, true) || !follows(a, "refund", lookup, false) {
		t.Fatal("a recorded call was not seen")
	}
	if follows(b, "refund", lookup, false) {
		t.Fatal("a call leaked into another snapshot")
	}
	// Found again by its epoch, the snapshot still has its calls.
	got, _, err := st.ByEpoch(a.Epoch)
	if err != nil || !follows(got, "refund", lookup, false) {
		t.Fatalf("calls lost between lookups (%v)", err)
	}
	// A snapshot the store never held has seen no calls.
	stray := Snapshot("a", "billing", "", time.Hour)
	follows(stray, "lookup_order", nil, true)
	if follows(stray, "refund", lookup, false) {
		t.Fatal("a call was recorded under a snapshot the store never held")
	}
}

func sequenceRulesNeedEveryPredecessor(t *testing.T, st Store) {
	s := Snapshot("a", "billing", "", time.Minute)
	Put(t, st, s)
	both := []string{"lookup_order", "verify_identity"}
	if _, err := st.Follows(s, "lookup_order", nil, true); err != nil {
		t.Fatal(err)
	}
	// refund is recorded only when it follows: a denied call is no
	// predecessor of anything.
	if ok, err := st.Follows(s, "refund", both, true); ok || err != nil {
		t.Fatalf("refund followed one of two predecessors: %v, %v", ok, err)
	}
	if ok, _ := st.Follows(s, "close_ticket", []string{"refund"}, false); ok {
		t.Fatal("a call that did not follow was recorded")
	}
	if _, err := st.Follows(s, "verify_identity", nil, true); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.Follows(s, "refund", both, true); !ok || err != nil {
		t.Fatalf("refund did not follow both predecessors: %v, %v", ok, err)
	}
	if ok, _ := st.Follows(s, "close_ticket", []string{"refund"}, false); !ok {
		t.Fatal("a call that followed was not recorded")
	}
}

// A snapshot the store took, or read back, is its own call log, as the
// policy's terms read it: the store's, so a call recorded through one copy
// is seen through another. One no store took keeps none, and fails closed.
func snapshotIsItsCallLog(t *testing.T, st Store) {
	s := Snapshot("a", "billing", "", time.Minute)
	Put(t, st, s)
	if ok, err := s.Follows("lookup_order", nil, true); !ok || err != nil {
		t.Fatalf("recording through the snapshot: %v, %v", ok, err)
	}
	got, _, err := st.ByEpoch(s.Epoch)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := got.Follows("refund", []string{"lookup_order"}, false); !ok || err != nil {
		t.Fatalf("the call recorded through one copy is not seen through another: %v, %v", ok, err)
	}
	stray := Snapshot("a", "billing", "", time.Minute)
	if ok, err := stray.Follows("lookup_order", nil, true); ok || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a snapshot no store took: %v, %v, want store.ErrUnavailable", ok, err)
	}
}

// A redeemed listing ticket is found redeemed until its keep runs out,
// and one never redeemed is not: the replica that issued a ticket counts
// it as lost only when no replica redeemed it.
func redemptionsAreKeptForTheirTime(t *testing.T, st Store) {
	short, long := "short-"+store.NewEpoch(), "long-"+store.NewEpoch()
	if err := st.Redeem([]string{short}, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := st.Redeem([]string{long}, time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := st.Redeemed([]string{short, "never-" + store.NewEpoch(), long})
	if err != nil || !slices.Equal(got, []bool{true, false, true}) {
		t.Fatalf("Redeemed = %v, %v; want [true false true]", got, err)
	}
	// Bounded: the short one's keep runs out well within the deadline.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, err := st.Redeemed([]string{short, long})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(got, []bool{false, true}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redeemed = %v long after the short keep ran out; want [false true]", got)
		}
	}
}
