package store

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
	if a, b := LatestKey("", "a|b", "c", ""), LatestKey("", "a", "b|c", ""); a == b {
		t.Fatalf("two principal/server pairs encode alike: %q", a)
	}
	if c, d := LatestKey("", "ab", "", "s"), LatestKey("", "a", "b", "s"); c == d {
		t.Fatalf("two principal/server pairs encode alike: %q", c)
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

// Once expired (but still retained), a snapshot records nothing.
func TestExpiredSnapshotRecordsNoCalls(t *testing.T) {
	now := time.Now()
	m, err := NewMemory(MemoryOptions{MaxSnapshots: 1000, Retain: time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	s := snapshot("a", "billing", "", time.Minute)
	if err := m.Put(s); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Minute)
	if _, err := m.Follows(s, "lookup_order", nil, true); err != nil {
		t.Fatal(err)
	}
	if ok, _ := m.Follows(s, "refund", []string{"lookup_order"}, false); ok {
		t.Fatal("a call was recorded under an expired snapshot")
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
		stored, ok, _ := m.ByEpoch(s.Epoch)
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
		if _, ok, _ := m.ByEpoch(s.Epoch); !ok {
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

// A counter is dropped once its last slot has stopped counting, and not
// before: the map does not grow with every principal that ever called.
func TestCountersAreSweptOnceTheyCountNothing(t *testing.T) {
	now := time.UnixMilli(1_699_999_980_000) // on a minute
	m, err := NewMemory(MemoryOptions{MaxSnapshots: 10, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	charge := func(counter string) {
		t.Helper()
		u, err := m.Reserve(policy.Charge{Counter: counter, Amount: 1, Limit: 10, Window: time.Hour, Slot: time.Minute})
		if err != nil || !u.Allowed {
			t.Fatalf("Reserve %s = %+v, %v", counter, u, err)
		}
	}
	held := func() int {
		m.counters.mu.Lock()
		defer m.counters.mu.Unlock()
		return len(m.counters.by)
	}
	charge("old")
	now = now.Add(time.Hour + time.Minute - time.Millisecond)
	charge("new")
	if n := held(); n != 2 {
		t.Fatalf("%d counters held while both count, want 2", n)
	}
	now = now.Add(time.Millisecond + sweepEvery)
	charge("newer")
	if n := held(); n != 2 {
		t.Fatalf("%d counters held once the first stopped counting, want 2", n)
	}
}
