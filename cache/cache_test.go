package cache

import (
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
		ObservedAt: time.Now(), ValidUntil: time.Now().Add(ttl), Pins: map[string]Pin{}}
	for _, p := range pins {
		s.Pins[p.ToolID] = p
	}
	return s
}

func TestKeyEncodingIsUnambiguous(t *testing.T) {
	// Without length prefixes these would both encode as "a|b|c|d|e|f".
	a := Key{"a|b", "c", "d", "e", "f"}
	b := Key{"a", "b|c", "d", "e", "f"}
	if a.String() == b.String() {
		t.Fatalf("%+v and %+v encode alike: %q", a, b, a.String())
	}
	c := Key{"ab", "", "d", "e", "f"}
	d := Key{"a", "b", "d", "e", "f"}
	if c.String() == d.String() {
		t.Fatalf("%+v and %+v encode alike", c, d)
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
	if got, ok := m.Pinned(exact); !ok || got != refund {
		t.Fatalf("Pinned(exact) = %+v, %v", got, ok)
	}
	for name, k := range map[string]Key{
		"other server":    {"payments", "refund", "sha256:aa", "agent-a", s.Epoch},
		"other digest":    {"billing", "refund", "sha256:bb", "agent-a", s.Epoch},
		"other principal": {"billing", "refund", "sha256:aa", "agent-b", s.Epoch},
		"other epoch":     {"billing", "refund", "sha256:aa", "agent-a", NewEpoch()},
		"other tool":      {"billing", "lookup_order", "sha256:aa", "agent-a", s.Epoch},
	} {
		if _, ok := m.Pinned(k); ok {
			t.Errorf("%s: found a pin for %+v", name, k)
		}
	}
	if got, ok := m.ByEpoch(s.Epoch); !ok || got != s {
		t.Fatalf("ByEpoch = %v, %v", got, ok)
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
	m := newStore(t)
	a := snapshot("a", "billing", "", time.Minute)
	b := snapshot("a", "billing", "", time.Minute)
	for _, s := range []*Snapshot{a, b} {
		if err := m.Put(s); err != nil {
			t.Fatal(err)
		}
	}
	if m.Called(a.Epoch, "lookup_order") {
		t.Fatal("a call recorded before any was made")
	}
	m.RecordCall(a, "lookup_order")
	if !m.Called(a.Epoch, "lookup_order") {
		t.Fatal("recorded call not found")
	}
	if m.Called(b.Epoch, "lookup_order") || m.Called(a.Epoch, "refund") {
		t.Fatal("a call leaked into another snapshot or tool")
	}
	// An expired snapshot records nothing.
	gone := snapshot("a", "billing", "", -time.Second)
	m.RecordCall(gone, "lookup_order")
	if m.Called(gone.Epoch, "lookup_order") {
		t.Fatal("a call was recorded under an expired snapshot")
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
