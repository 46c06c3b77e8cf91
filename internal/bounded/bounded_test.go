package bounded

import (
	"fmt"
	"sync"
	"testing"
)

func TestGetDerivesOnceAndStartsOver(t *testing.T) {
	var m Map[string, int]
	derived := 0
	get := func(k string) int {
		return m.Get(k, 3, func() (string, int) { derived++; return k, len(k) })
	}
	for _, k := range []string{"a", "bb", "a", "ccc", "bb"} {
		if v := get(k); v != len(k) {
			t.Fatalf("Get(%q) = %d", k, v)
		}
	}
	if derived != 3 || m.n.Load() != 3 {
		t.Fatalf("derived %d times, %d held; want 3, 3", derived, m.n.Load())
	}
	// Full: the next new key starts the map over.
	get("dddd")
	if _, ok := m.Load("a"); ok || m.n.Load() != 1 {
		t.Fatalf("a full map kept its entries: %d held", m.n.Load())
	}
	if v, ok := m.Load("dddd"); !ok || v != 4 {
		t.Fatalf("Load(dddd) = %d, %v", v, ok)
	}
}

func TestStoreReplacesAndCounts(t *testing.T) {
	var m Map[string, int]
	m.Store("k", 1, 2)
	m.Store("k", 2, 2) // a replacement is not a new entry
	if v, _ := m.Load("k"); v != 2 || m.n.Load() != 1 {
		t.Fatalf("k = %d, %d held", v, m.n.Load())
	}
	m.Store("l", 1, 2)
	m.Store("m", 1, 2)
	if _, ok := m.Load("k"); ok || m.n.Load() != 1 {
		t.Fatalf("a full map kept its entries: %d held", m.n.Load())
	}
	m.Clear()
	if _, ok := m.Load("m"); ok || m.n.Load() != 0 {
		t.Fatal("Clear kept an entry")
	}
}

func TestConcurrentGet(t *testing.T) {
	var m Map[int, string]
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				k := (g*1000 + i) % 300
				if v := m.Get(k, 100, func() (int, string) { return k, fmt.Sprint(k) }); v != fmt.Sprint(k) {
					t.Errorf("Get(%d) = %q", k, v)
				}
			}
		})
	}
	wg.Wait()
	if n := m.n.Load(); n > 100+8 {
		t.Fatalf("%d held, bound 100 (and one a racing writer)", n)
	}
}
