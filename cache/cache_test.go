package cache

import (
	"fmt"
	"testing"
	"time"

	"github.com/capsnap/capsnap/policy"
)

func newStore(t *testing.T) *Memory {
	t.Helper()
	m, err := NewMemory(MemoryOptions{MaxSnapshots: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func snapshot(principal, server, session string, ttl time.Duration, pins ...Pin) *Snapshot {
	s := &Snapshot{Epoch: NewEpoch(), Principal: principal, ServerID: server, Session: session,
		ObservedAt: time.Now(), ValidUntil: time.Now().Add(ttl), Pins: pins}
	return s
}

func TestKeyEncodingIsUnambiguous(t *testing.T) {
	// Without length prefixes these would both encode as "a|b|c".
	if a, b := latestKey("a|b", "c", ""), latestKey("a", "b|c", ""); a == b {
		t.Fatalf("two principal/server pairs encode alike: %q", a)
	}
	if c, d := latestKey("ab", "", "s"), latestKey("a", "b", "s"); c == d {
		t.Fatalf("two principal/server pairs encode alike: %q", c)
	}
}

// The store finds a snapshot by its epoch alone, and the snapshot holds
// the rest of the tuple for the caller to match: its principal, its
// server, and each pinned tool at one digest. (extauthz holds a call to
// them: principal_mismatch, no_snapshot for another server, schema_drift
// for another digest.)
func TestSnapshotHoldsTheWholeTuple(t *testing.T) {
	m := newStore(t)
	refund := Pin{ToolID: "refund", SchemaDigest: "sha256:aa", Effect: policy.MoneyMove, PolicyDigest: "sha256:pp"}
	s := snapshot("agent-a", "billing", "", time.Minute, refund)
	if err := m.Put(s); err != nil {
		t.Fatal(err)
	}
	stored, ok := m.ByEpoch(s.Epoch)
	if !ok || stored != s || stored.Principal != "agent-a" || stored.ServerID != "billing" {
		t.Fatalf("ByEpoch = %+v, %v", stored, ok)
	}
	if got, ok := stored.Pin("refund"); !ok || got != refund {
		t.Fatalf("Pin(refund) = %+v, %v", got, ok)
	}
	if _, ok := stored.Pin("lookup_order"); ok {
		t.Error("found a pin for a tool the snapshot does not pin")
	}
	if _, ok := m.ByEpoch(NewEpoch()); ok {
		t.Error("found a snapshot under another epoch")
	}
}

func TestLatestPerPrincipalServerSession(t *testing.T) {
	m := newStore(t)
	first := snapshot("a", "billing", "s1", time.Minute)
	second := snapshot("a", "billing", "s1", time.Minute)
	other := snapshot("a", "billing", "s2", time.Minute)
	for _, s := range []*Snapshot{first, second, other} {
		if err := m.Put(s); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := m.Latest("a", "billing", "s1"); got != second {
		t.Errorf("Latest(s1) = %v, want the second snapshot", got)
	}
	if got, _ := m.Latest("a", "billing", "s2"); got != other {
		t.Errorf("Latest(s2) = %v, want its own", got)
	}
	if _, ok := m.Latest("b", "billing", "s1"); ok {
		t.Error("another principal found a's snapshot")
	}
	if got, _ := m.LatestInAnySession("a", "billing"); got != other {
		t.Errorf("LatestInAnySession = %v, want the newest of every session", got)
	}
	if _, ok := m.LatestInAnySession("a", "payments"); ok {
		t.Error("a snapshot on billing was found on payments")
	}
	// An empty session is a session of its own, not the any-session key.
	if _, ok := m.Latest("a", "billing", ""); ok {
		t.Error("Latest with no session found a session's snapshot")
	}
	// The older snapshot stays findable by its epoch until it expires.
	if _, ok := m.ByEpoch(first.Epoch); !ok {
		t.Error("first snapshot gone")
	}
}

func TestExpiredSnapshotIsRefused(t *testing.T) {
	m := newStore(t)
	s := snapshot("a", "billing", "", -time.Second)
	if err := m.Put(s); err == nil {
		t.Fatal("Put accepted an expired snapshot")
	}
}

func TestEpochsAreUnique(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		e := NewEpoch()
		if seen[e] || len(e) != len("ep_")+22 {
			t.Fatalf("epoch %q repeated or malformed", e)
		}
		seen[e] = true
	}
}

func TestCallsAreRecordedPerSnapshot(t *testing.T) {
	now := time.Now()
	m, err := NewMemory(MemoryOptions{MaxSnapshots: 1000, Retain: time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	a := snapshot("a", "billing", "", time.Minute)
	b := snapshot("a", "billing", "", time.Minute)
	for _, s := range []*Snapshot{a, b} {
		if err := m.Put(s); err != nil {
			t.Fatal(err)
		}
	}
	if m.Called(a, "lookup_order") {
		t.Fatal("a call recorded before any was made")
	}
	m.RecordCall(a, "lookup_order")
	if !m.Called(a, "lookup_order") {
		t.Fatal("recorded call not found")
	}
	if m.Called(b, "lookup_order") || m.Called(a, "refund") {
		t.Fatal("a call leaked into another snapshot or tool")
	}
	// Found again by its epoch, the snapshot still has its calls.
	if got, _ := m.ByEpoch(a.Epoch); !m.Called(got, "lookup_order") {
		t.Fatal("calls lost between lookups")
	}
	// Once expired (but still retained), a snapshot records nothing.
	now = now.Add(2 * time.Minute)
	m.RecordCall(b, "lookup_order")
	if m.Called(b, "lookup_order") {
		t.Fatal("a call was recorded under an expired snapshot")
	}
	// Nor does one this store never held.
	stray := snapshot("a", "billing", "", time.Hour)
	m.RecordCall(stray, "lookup_order")
	if m.Called(stray, "lookup_order") {
		t.Fatal("a call was recorded under a snapshot the store never held")
	}
}

// A snapshot's pins are held as one: pinning far more tools than there are
// snapshots must not evict any of them (a missing pin reads as drift).
func TestLargeSnapshotsKeepEveryPin(t *testing.T) {
	m, err := NewMemory(MemoryOptions{MaxSnapshots: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	var snaps []*Snapshot
	for range 4 {
		var pins []Pin
		for i := range 5000 {
			pins = append(pins, Pin{ToolID: fmt.Sprintf("tool_%d", i), SchemaDigest: "sha256:aa", Effect: policy.Read})
		}
		s := snapshot("a", "billing", "", time.Minute, pins...)
		if err := m.Put(s); err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, s)
	}
	for _, s := range snaps {
		stored, ok := m.ByEpoch(s.Epoch)
		if !ok {
			t.Fatalf("snapshot %s lost", s.Epoch)
		}
		for i := range 5000 {
			tool := fmt.Sprintf("tool_%d", i)
			if p, ok := stored.Pin(tool); !ok || p.SchemaDigest != "sha256:aa" {
				t.Fatalf("snapshot %s lost its pin of %s: %+v", s.Epoch, tool, p)
			}
		}
	}
}

// MaxSnapshots counts snapshots: a store of n holds n of them.
func TestHoldsMaxSnapshots(t *testing.T) {
	const n = 2000
	m, err := NewMemory(MemoryOptions{MaxSnapshots: n})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	var snaps []*Snapshot
	for i := range n {
		s := snapshot("a", "billing", fmt.Sprint(i), time.Minute)
		if err := m.Put(s); err != nil {
			t.Fatalf("snapshot %d of %d: %v", i+1, n, err)
		}
		snaps = append(snaps, s)
	}
	for i, s := range snaps {
		if _, ok := m.ByEpoch(s.Epoch); !ok {
			t.Fatalf("snapshot %d of %d evicted below MaxSnapshots", i+1, n)
		}
	}
}

func TestHeldCountsPuts(t *testing.T) {
	m := newStore(t)
	for range 3 {
		if err := m.Put(snapshot("a", "billing", "", time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.Held(); got != 3 {
		t.Fatalf("Held = %d, want 3", got)
	}
}
