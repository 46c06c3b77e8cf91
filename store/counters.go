package store

import (
	"cmp"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/capsnap/capsnap/policy"
)

// The Memory store's counters of the policy's budgets and rate limits
// (policy.Counters), counted as policy.Counters says: in slots, by start.

// counters are every counter a Memory store holds. A counter is dropped
// once its last slot stops counting, never before: one dropped early
// would give its principal the window again. So they are in a map, not in
// ristretto, which evicts what it must.
type counters struct {
	mu sync.Mutex
	by map[string]*tally
	// sweptAt is when the map was last swept of counters that count
	// nothing any more, in Unix milliseconds.
	sweptAt int64
}

// tally is one counter: its slots, by start, and when the last of them
// stops counting.
type tally struct {
	slots []slot
	until int64
}

type slot struct{ start, amount int64 }

// sweepEvery is how often a reservation sweeps the counters that have
// stopped counting out of the map.
const sweepEvery = time.Minute

var errCharge = errors.New("store: a charge needs a positive window and slot, and a limit and amount of at least 0")

// Reserve implements policy.Counters.
func (m *Memory) Reserve(c policy.Charge) (policy.Usage, error) {
	if c.Window <= 0 || c.Slot <= 0 || c.Amount < 0 || c.Limit < 0 {
		return policy.Usage{}, errCharge
	}
	now := m.now().UnixMilli()
	width, span := c.Slot.Milliseconds(), c.Window.Milliseconds()
	m.counters.mu.Lock()
	defer m.counters.mu.Unlock()
	m.counters.sweep(now)
	t, held := m.counters.by[c.Counter]
	if !held {
		t = &tally{}
	}
	u := t.take(now, width, span, c.Amount, c.Limit)
	if !held && len(t.slots) > 0 {
		if m.counters.by == nil {
			m.counters.by = map[string]*tally{}
		}
		m.counters.by[c.Counter] = t
	}
	return u, nil
}

// Release implements policy.Counters.
func (m *Memory) Release(counter string, at time.Time, amount int64) error {
	start := at.UnixMilli()
	m.counters.mu.Lock()
	defer m.counters.mu.Unlock()
	t := m.counters.by[counter]
	if t == nil {
		return nil
	}
	i, ok := slices.BinarySearchFunc(t.slots, start, bySlotStart)
	if !ok {
		return nil
	}
	if t.slots[i].amount -= amount; t.slots[i].amount <= 0 {
		t.slots = slices.Delete(t.slots, i, i+1)
	}
	if len(t.slots) == 0 {
		delete(m.counters.by, counter)
	}
	return nil
}

// take takes amount at now if the slots that still count, with it, hold
// at most limit: in the slot now falls in, which counts until its end plus
// span.
func (t *tally) take(now, width, span, amount, limit int64) policy.Usage {
	// Slots stop counting in order of start, so the ones that have are
	// a prefix.
	live := 0
	for live < len(t.slots) && t.slots[live].start+width+span <= now {
		live++
	}
	t.slots = slices.Delete(t.slots, 0, live)
	var used int64
	for _, s := range t.slots {
		used += s.amount
	}
	if used+amount > limit {
		u := policy.Usage{Used: used}
		if amount <= limit {
			// The oldest slots stop counting first: the call fits once
			// enough of them have.
			freed := int64(0)
			for _, s := range t.slots {
				if freed += s.amount; used-freed+amount <= limit {
					u.RetryAfter = time.Duration(s.start+width+span-now) * time.Millisecond
					break
				}
			}
		}
		return u
	}
	start := now - now%width
	if amount > 0 {
		// The clock may have gone back: a slot is not always the newest.
		i, ok := slices.BinarySearchFunc(t.slots, start, bySlotStart)
		if ok {
			t.slots[i].amount += amount
		} else {
			t.slots = slices.Insert(t.slots, i, slot{start, amount})
		}
	}
	if n := len(t.slots); n > 0 {
		t.until = max(t.until, t.slots[n-1].start+width+span)
	}
	return policy.Usage{Allowed: true, Used: used, At: time.UnixMilli(start)}
}

// sweep drops the counters that count nothing any more, once every
// sweepEvery.
func (c *counters) sweep(now int64) {
	if now-c.sweptAt < sweepEvery.Milliseconds() {
		return
	}
	c.sweptAt = now
	for k, t := range c.by {
		if t.until <= now {
			delete(c.by, k)
		}
	}
}

func bySlotStart(s slot, start int64) int { return cmp.Compare(s.start, start) }

// Count is what a counter holds now, as Counts reads it.
type Count struct {
	// Used is what the window holds, in counter units.
	Used int64
	// FreesAt is when the oldest amount it holds stops counting, and
	// ResetsAt when the newest does: the counter is empty from then, if
	// nothing more is taken. Both are zero when it holds nothing.
	FreesAt, ResetsAt time.Time
}

// Counts are what an operator reads and resets of the counters of the
// policy's budgets and rate limits (capsnap budgets), beside what the
// decision takes from them (policy.Counters). Each counts as a charge in
// window and slot counts (policy.Counters).
type Counts interface {
	// Count is what counter holds now.
	Count(counter string, window, slot time.Duration) (Count, error)
	// ResetCounter empties counter, and returns what it held: its
	// principal has the whole window again. A release of what was taken
	// before the reset gives back only what the counter holds in that
	// slot since: never more than was taken after it.
	ResetCounter(counter string, window, slot time.Duration) (Count, error)
}

// Count implements Counts.
func (m *Memory) Count(counter string, window, slot time.Duration) (Count, error) {
	return m.count(counter, window, slot, false)
}

// ResetCounter implements Counts.
func (m *Memory) ResetCounter(counter string, window, slot time.Duration) (Count, error) {
	return m.count(counter, window, slot, true)
}

// count is what counter holds, then emptied if reset.
func (m *Memory) count(counter string, window, slot time.Duration, reset bool) (Count, error) {
	if window <= 0 || slot <= 0 {
		return Count{}, errCharge
	}
	now := m.now().UnixMilli()
	width, span := slot.Milliseconds(), window.Milliseconds()
	m.counters.mu.Lock()
	defer m.counters.mu.Unlock()
	var c Count
	t := m.counters.by[counter]
	if t == nil {
		return c, nil
	}
	if reset {
		delete(m.counters.by, counter)
	}
	// Slots are by start, so the first that counts stops counting first.
	for _, s := range t.slots {
		end := s.start + width + span
		if end <= now {
			continue
		}
		if c.Used == 0 {
			c.FreesAt = time.UnixMilli(end)
		}
		c.Used += s.amount
		c.ResetsAt = time.UnixMilli(end)
	}
	return c, nil
}
