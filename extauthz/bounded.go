package extauthz

import (
	"sync"
	"sync/atomic"
)

// bounded maps keys to values derived from them, for what every Check
// reads and almost none writes: reads take no lock (sync.Map), and when it
// holds max entries it starts over, since every value can be derived
// again.
type bounded[K comparable, V any] struct {
	m sync.Map
	n atomic.Int64
}

// get returns k's value, deriving it with derive on a miss. derive also
// returns the key to keep, equal to k: a copy, where k may point into a
// request that the map must not keep alive. Two Checks that miss at once
// may both derive it; one value is kept.
func (b *bounded[K, V]) get(k K, max int64, derive func() (K, V)) V {
	if v, ok := b.m.Load(k); ok {
		return v.(V)
	}
	b.makeRoom(max)
	kept, v := derive()
	got, loaded := b.m.LoadOrStore(kept, v)
	if !loaded {
		b.n.Add(1)
	}
	return got.(V)
}

// load returns k's value, if held.
func (b *bounded[K, V]) load(k K) (V, bool) {
	v, ok := b.m.Load(k)
	if !ok {
		var zero V
		return zero, false
	}
	return v.(V), true
}

// store holds v for k, replacing any value held: k must not point into a
// request.
func (b *bounded[K, V]) store(k K, v V, max int64) {
	b.makeRoom(max)
	if _, loaded := b.m.Swap(k, v); !loaded {
		b.n.Add(1)
	}
}

// makeRoom starts over when the map holds max entries.
func (b *bounded[K, V]) makeRoom(max int64) {
	if b.n.Load() >= max {
		b.m.Clear()
		b.n.Store(0)
	}
}
