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

func TestPinnedNeedsTheWholeTuple(t *testing.T) {
	m := newStore(t)
	refund := Pin{ToolID: "refund", SchemaDigest: "sha256:aa", Effect: policy.MoneyMove, PolicyDigest: "sha256:pp"}
	s := snapshot("agent-a", "billing", "", time.Minute, refund)
	if err := m.Put(s); err != nil {
		t.Fatal(err)
	}
	exact := Key{"billing", "refund", "sha256:aa", "agent-a", s.Epoch}
	stored, ok := m.ByEpoch(s.Epoch)
	if !ok || stored != s {
		t.Fatalf("ByEpoch = %v, %v", stored, ok)
	}
	if got, ok := stored.Pinned(exact); !ok || got != refund {
		t.Fatalf("Pinned(exact) = %+v, %v", got, ok)
	}
	for name, k := range map[string]Key{
		"other server":    {"payments", "refund", "sha256:aa", "agent-a", s.Epoch},
		"other digest":    {"billing", "refund", "sha256:bb", "agent-a", s.Epoch},
		"other principal": {"billing", "refund", "sha256:aa", "agent-b", s.Epoch},
		"other epoch":     {"billing", "refund", "sha256:aa", "agent-a", NewEpoch()},
		"other tool":      {"billing", "lookup_order", "sha256:aa", "agent-a", s.Epoch},
	} {
		if _, ok := stored.Pinned(k); ok {
			t.Errorf("%s: found a pin for %+v", name, k)
		}
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
			k := Key{ServerID: "billing", ToolID: fmt.Sprintf("tool_%d", i), SchemaDigest: "sha256:aa", Principal: "a", Epoch: s.Epoch}
			if _, ok := stored.Pinned(k); !ok {
				t.Fatalf("pin %+v lost", k)
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
