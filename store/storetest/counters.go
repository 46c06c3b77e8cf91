// The counters' part of the contract: on a clock the tests control, the
// memory store of one replica and a store several replicas share count the
// same window the same way, so a budget allows and denies alike whichever
// a replica uses.

package storetest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// Clock is a clock a test moves. Its zero value is not usable: NewClock.
type Clock struct{ ms atomic.Int64 }

// NewClock returns a clock at t.
func NewClock(t time.Time) *Clock {
	c := &Clock{}
	c.ms.Store(t.UnixMilli())
	return c
}

// Now is the clock's time, for a store's options.
func (c *Clock) Now() time.Time { return time.UnixMilli(c.ms.Load()) }

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

// Start is where each case's clock starts: on a slot boundary of the
// window every case counts in (a minute, in slots of a second).
var Start = time.UnixMilli(1_700_000_000_000)

const (
	window = time.Minute
	slot   = time.Second
	limit  = 1000
)

// step is one thing a case does: move the clock, then reserve on (or
// release from, count or reset) a counter, and what the store must
// answer.
type step struct {
	advance time.Duration
	counter string
	amount  int64
	// limit, when set, is the charge's, else the contract's limit.
	limit int64
	// release, when set, gives back amount taken at that many
	// milliseconds after Start instead of reserving.
	release    bool
	releasedAt time.Duration
	// count, when set, reads the counter (Count) instead, and reset
	// empties it (ResetCounter): each must answer used and, as times
	// after Start, frees and resets (0: it holds nothing).
	count, reset  bool
	frees, resets time.Duration
	// What a reservation must answer: allowed, used before it, and when
	// denied, the retry (0: never).
	allowed bool
	used    int64
	retry   time.Duration
}

func reserve(amount int64, allowed bool, used int64, retry time.Duration) step {
	return step{counter: "a", amount: amount, allowed: allowed, used: used, retry: retry}
}

func after(d time.Duration, s step) step { s.advance = d; return s }

func on(counter string, s step) step { s.counter = counter; return s }

func release(at time.Duration, amount int64) step {
	return step{counter: "a", release: true, releasedAt: at, amount: amount}
}

func count(used int64, frees, resets time.Duration) step {
	return step{counter: "a", count: true, used: used, frees: frees, resets: resets}
}

func reset(used int64, frees, resets time.Duration) step {
	s := count(used, frees, resets)
	s.count, s.reset = false, true
	return s
}

// runCounters runs the counters' part against the backends open makes.
func runCounters(t *testing.T, open Open) {
	ms := time.Millisecond
	tests := []struct {
		name  string
		steps []step
	}{
		{"FillsExactlyToTheLimit", []step{
			reserve(100, true, 0, 0), reserve(100, true, 100, 0), reserve(100, true, 200, 0), reserve(100, true, 300, 0),
			reserve(100, true, 400, 0), reserve(100, true, 500, 0), reserve(100, true, 600, 0), reserve(100, true, 700, 0),
			reserve(100, true, 800, 0), reserve(100, true, 900, 0),
			// The first slot stops counting at its end plus the window.
			reserve(100, false, 1000, window+slot),
			after(500*ms, reserve(1, false, 1000, window+slot-500*ms)),
		}},
		{"AnAmountCountsUntilItsSlotEndsPlusTheWindow", []step{
			after(999*ms, reserve(1000, true, 0, 0)),
			after(window, reserve(1, false, 1000, 1*ms)),
			after(1*ms, reserve(1000, true, 0, 0)),
		}},
		{"TheOldestSlotsStopCountingFirst", []step{
			reserve(300, true, 0, 0),
			after(10*time.Second, reserve(300, true, 300, 0)),
			after(10*time.Second, reserve(400, true, 600, 0)),
			after(10*time.Second, reserve(300, false, 1000, window+slot-30*time.Second)),
			// 500 fits once the first two slots have stopped counting.
			reserve(500, false, 1000, window+slot-20*time.Second),
			// And it does, then; the third still counts.
			after(window+slot-20*time.Second, reserve(500, true, 400, 0)),
		}},
		{"AnAmountOverTheLimitNeverFits", []step{
			reserve(1001, false, 0, 0),
			reserve(1000, true, 0, 0),
		}},
		{"ZeroTakesNothing", []step{
			reserve(1000, true, 0, 0),
			reserve(0, true, 1000, 0),
			reserve(1, false, 1000, window+slot),
		}},
		{"ALowerLimitDeniesUntilEnoughStopsCounting", []step{
			reserve(800, true, 0, 0),
			after(30*time.Second, step{counter: "a", amount: 0, limit: 500, used: 800, retry: window + slot - 30*time.Second}),
		}},
		{"ReleaseGivesBack", []step{
			after(400*ms, reserve(600, true, 0, 0)),
			reserve(500, false, 600, window+slot-400*ms),
			release(0, 600),
			reserve(500, true, 0, 0),
			// More than the slot holds empties it, and no more.
			release(0, 900),
			reserve(1000, true, 0, 0),
		}},
		{"ReleaseOfASlotThatStoppedCountingGivesNothing", []step{
			reserve(600, true, 0, 0),
			after(window+slot, reserve(1000, true, 0, 0)),
			release(0, 600),
			reserve(1, false, 1000, window+slot),
		}},
		{"CountersAreApart", []step{
			reserve(1000, true, 0, 0),
			on("b", reserve(1000, true, 0, 0)),
			reserve(1, false, 1000, window+slot),
		}},
		{"ACountIsWhatTheWindowHolds", []step{
			count(0, 0, 0),
			after(400*ms, reserve(300, true, 0, 0)),
			after(10*time.Second, reserve(200, true, 300, 0)),
			count(500, window+slot, window+slot+10*time.Second),
			// Counting takes nothing.
			count(500, window+slot, window+slot+10*time.Second),
			after(window+slot-10*time.Second-400*ms, count(200, window+slot+10*time.Second, window+slot+10*time.Second)),
			after(10*time.Second, count(0, 0, 0)),
		}},
		{"AResetEmptiesTheCounter", []step{
			reserve(900, true, 0, 0),
			after(2*time.Second, reset(900, window+slot, window+slot)),
			count(0, 0, 0),
			reserve(1000, true, 0, 0),
			// What was taken before the reset, in a slot that has held
			// nothing since, gives nothing back.
			release(0, 900),
			count(1000, window+slot+2*time.Second, window+slot+2*time.Second),
			reset(1000, window+slot+2*time.Second, window+slot+2*time.Second),
			reset(0, 0, 0),
		}},
		{"AResetIsOfOneCounter", []step{
			reserve(1000, true, 0, 0),
			on("b", reserve(400, true, 0, 0)),
			reset(1000, window+slot, window+slot),
			on("b", count(400, window+slot, window+slot)),
			on("b", reserve(700, false, 400, window+slot)),
		}},
		{"AResetOfWhatStoppedCountingHeldNothing", []step{
			reserve(1000, true, 0, 0),
			after(window+slot, reset(0, 0, 0)),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := NewClock(Start)
			c := open(t, clock)
			prefix := fmt.Sprintf("%s/%d/", t.Name(), time.Now().UnixNano())
			for i, s := range tt.steps {
				clock.Advance(s.advance)
				if s.count || s.reset {
					checkCount(t, i, c, prefix+s.counter, s)
					continue
				}
				if s.release {
					if err := c.Release(prefix+s.counter, Start.Add(s.releasedAt), s.amount); err != nil {
						t.Fatalf("step %d: Release: %v", i, err)
					}
					continue
				}
				lim := int64(limit)
				if s.limit != 0 {
					lim = s.limit
				}
				charge := Charge(prefix+s.counter, s.amount)
				charge.Limit = lim
				u, err := c.Reserve(charge)
				if err != nil {
					t.Fatalf("step %d: Reserve: %v", i, err)
				}
				if u.Allowed != s.allowed || u.Used != s.used || u.RetryAfter != s.retry {
					t.Fatalf("step %d at +%v: Reserve(%d) = allowed %v, used %d, retry %v; want %v, %d, %v",
						i, clock.Now().Sub(Start), s.amount, u.Allowed, u.Used, u.RetryAfter, s.allowed, s.used, s.retry)
				}
				if want := clock.Now().Truncate(slot); s.allowed && !u.At.Equal(want) {
					t.Fatalf("step %d: taken at %v, want the slot starting %v", i, u.At, want)
				}
			}
		})
	}
	t.Run("ConcurrentReservationsAreSerialised", func(t *testing.T) {
		clock := NewClock(Start)
		c := open(t, clock)
		if got := Concurrent(t, []policy.Counters{c}, fmt.Sprintf("concurrent/%d", time.Now().UnixNano()), 64); len(got) != 10 {
			t.Fatalf("%d of 64 reservations of 100 against 1000 allowed, want 10", len(got))
		}
	})
}

// checkCount runs step i, a count or reset, on counter of c.
func checkCount(t *testing.T, i int, c Store, counter string, s step) {
	t.Helper()
	read, op := c.Count, "Count"
	if s.reset {
		read, op = c.ResetCounter, "ResetCounter"
	}
	got, err := read(counter, window, slot)
	if err != nil {
		t.Fatalf("step %d: %s: %v", i, op, err)
	}
	want := store.Count{Used: s.used}
	if s.used > 0 {
		want.FreesAt, want.ResetsAt = Start.Add(s.frees), Start.Add(s.resets)
	}
	if got.Used != want.Used || !got.FreesAt.Equal(want.FreesAt) || !got.ResetsAt.Equal(want.ResetsAt) {
		t.Fatalf("step %d: %s = used %d, frees %v, resets %v; want %d, %v, %v",
			i, op, got.Used, got.FreesAt, got.ResetsAt, want.Used, want.FreesAt, want.ResetsAt)
	}
}

// Concurrent makes n reservations of 100 against a limit of 1000 on
// counter at once, spread over stores (replicas of one store), and returns
// the allowed ones.
func Concurrent(t *testing.T, stores []policy.Counters, counter string, n int) []policy.Usage {
	t.Helper()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		allowed []policy.Usage
	)
	start := make(chan struct{})
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			u, err := stores[i%len(stores)].Reserve(Charge(counter, 100))
			if err != nil {
				errs <- err
				return
			}
			if u.Allowed {
				mu.Lock()
				allowed = append(allowed, u)
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return allowed
}

// Charge is a charge of amount on counter in the contract's window and
// limit, as Concurrent makes.
func Charge(counter string, amount int64) policy.Charge {
	return policy.Charge{Counter: counter, Amount: amount, Limit: limit, Window: window, Slot: slot}
}
