// Package bounded is a map for what every request reads and almost none
// writes, bounded by starting over: reads take no lock (sync.Map), and a
// map that holds its bound of entries is emptied before the next is added,
// since every value it holds can be had again.
package bounded

import (
	"sync"
	"sync/atomic"
)

// Map maps keys of type K to values of type V. The zero Map is empty and
// ready to use.
type Map[K comparable, V any] struct {
	m sync.Map
	n atomic.Int64
}

// Get returns k's value, deriving it with derive on a miss, and keeping
// it in a map of at most max entries. derive also returns the key to keep,
// equal to k: a copy, where k may point into a request that the map must
// not keep alive. Two callers that miss at once may both derive it; one
// value is kept.
func (b *Map[K, V]) Get(k K, max int64, derive func() (K, V)) V {
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

// Load returns k's value, if held.
func (b *Map[K, V]) Load(k K) (V, bool) {
	v, ok := b.m.Load(k)
	if !ok {
		var zero V
		return zero, false
	}
	return v.(V), true
}

// Store holds v for k, replacing any value held, in a map of at most max
// entries: k must not point into a request.
func (b *Map[K, V]) Store(k K, v V, max int64) {
	b.makeRoom(max)
	if _, loaded := b.m.Swap(k, v); !loaded {
		b.n.Add(1)
	}
}

// Clear empties the map.
func (b *Map[K, V]) Clear() {
	b.m.Clear()
	b.n.Store(0)
}

func (b *Map[K, V]) makeRoom(max int64) {
	if b.n.Load() >= max {
		b.Clear()
	}
}
