package policy

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/capsnap/capsnap/deny"
)

// Budgets (budget.go) and rate limits (ratelimit.go) are the rules that
// count across calls: each keeps a counter per principal in a Counters
// store and takes a call's amount from it, atomically, as it allows the
// call. This file is what they share: the store's interface, the window
// both count in, and the reservation the decision core keeps.

// Counters is where budgets and rate limits count: one counter per
// principal and rule, kept in process for one replica or in the store the
// replicas share, so that what a call takes on one replica counts on
// every other. An error is the store's: the call under the rule is denied
// store_unavailable, and calls under no rule never ask.
//
// A counter sums the amounts taken in the last Window, in slots of Slot:
// an amount counts from the moment it is taken until the end of the slot
// it was taken in, plus Window. So it counts for at least Window and at
// most Window+Slot (Slot is a sixtieth of the window, WindowSlots): the
// window never holds more than the limit, measured over any span of
// Window, and a denial can say exactly when the oldest slots stop
// counting. Slots are by the store's clock in Unix milliseconds, starting
// at multiples of Slot.
type Counters interface {
	// Reserve takes c.Amount from the counter if what it holds in the
	// window, with c.Amount, is at most c.Limit; otherwise it takes
	// nothing and says when the amount fits. Concurrent reservations of
	// one counter, from any replica, are serialised: 64 calls of 100
	// against 1000 leave exactly 10 allowed.
	Reserve(c Charge) (Usage, error)
	// Release gives back amount taken in the slot starting at at (a
	// Usage.At), as far as the slot still holds it; a slot that has
	// stopped counting has nothing to give back.
	Release(counter string, at time.Time, amount int64) error
}

// WindowSlots is how many slots a window is counted in: an amount counts
// for at most a sixtieth of its window longer than the window.
const WindowSlots = 60

// Units is how many counter units make one unit of a budget's amount:
// amounts and limits are counted in thousandths, exact to three decimal
// places (every ISO 4217 currency's minor unit); a finer amount is rounded
// up. A rate limit's call is one unit.
const Units = 1000

// maxUnits bounds a limit, and so what a counter holds, to integers a
// double holds exactly, with room to add a call's amount: a Redis script
// counts in doubles.
const maxUnits = 1 << 52

// Charge is one call's take from one counter.
type Charge struct {
	// Counter names the counter: the rule and the principal (and, for a
	// rule counted per tool, the tool), encoded unambiguously.
	Counter string
	// Amount and Limit are in counter units (Units a budget unit).
	Amount, Limit int64
	// Window is how far back the counter sums, and Slot the width of the
	// slots it sums in (see Counters).
	Window, Slot time.Duration
}

// Usage is a counter's answer to a Charge.
type Usage struct {
	// Allowed is whether the amount was taken.
	Allowed bool
	// Used is what the window held before the charge, in counter units.
	Used int64
	// At is the start of the slot an allowed amount was taken in, for
	// Release.
	At time.Time
	// RetryAfter is, for a charge not allowed, how long until enough of
	// the window stops counting for it to fit; 0 if it never will (its
	// amount is over the limit).
	RetryAfter time.Duration
}

// Reservation is what one recording term took from one counter for a call
// it allowed: for the audit trail, for the per-budget metrics (Kind and
// Name are bounded labels, the counter is not), and to give back (Release)
// when the upstream answers the call with an error and the operator wants
// that, on whichever replica sees the answer.
type Reservation struct {
	// Kind is "budget" or "rate_limit"; Name the rule's name.
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Counter, At and Amount are the Charge's counter, the Usage's slot
	// and the amount taken, in counter units.
	Counter string    `json:"counter"`
	At      time.Time `json:"at"`
	Amount  int64     `json:"amount"`
}

// The kinds of rule that count.
const (
	KindBudget    = "budget"
	KindRateLimit = "rate_limit"
)

// A Reserver is a recording term that takes an amount from a counter as it
// allows a call (Call.Counters): unlike a sequence rule's record of a call,
// what it took can be given back. Its Check is Reserve with the
// reservation dropped; the core calls Record instead.
type Reserver interface {
	Term
	Reserve(call Call) (Reservation, error)
}

// Counted is a budget or a rate limit as a test sees it that starts its
// counter where the test says, as if calls before the one it decides had
// been allowed (capsnap policy test).
type Counted interface {
	Reserver
	// Names are its name and its field in the file (tools[0].budgets[1]).
	Names() (name, field string)
	// Taken is the charge that takes amount, in the rule's own units (a
	// budget's amount, a rate limit's calls), from call's counter whatever
	// it holds. ok is false for an amount no counter holds: negative, a
	// rate limit's calls not a whole number, or more than any limit.
	Taken(call Call, amount float64) (c Charge, ok bool)
}

var (
	_ Counted = (*Budget)(nil)
	_ Counted = (*RateLimit)(nil)
)

// Record runs the recording terms of terms on call, in order, once every
// other term has allowed it (the core calls it where it ran them with
// Check): it returns what the terms that reserve took, for the audit trail
// and for Release. If a term denies the call, or fails, what the terms
// before it reserved is given back before the denial (or the store's
// error) is returned, so that a denied call takes nothing. A failure to
// give back is joined to it: the counter then holds more than was allowed,
// which denies more, never less.
func Record(terms []Term, call Call) ([]Reservation, error) {
	var taken []Reservation
	for _, t := range terms {
		if !t.Records() {
			continue
		}
		var err error
		if r, ok := t.(Reserver); ok {
			var res Reservation
			if res, err = r.Reserve(call); err == nil {
				taken = append(taken, res)
			}
		} else {
			err = t.Check(call)
		}
		if err != nil {
			if rerr := Release(call.Counters, taken); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return nil, err
		}
	}
	return taken, nil
}

// Release gives back what rs took from c: for a call that was denied after
// all, or (where the operator turns it on) one the upstream answered with
// a JSON-RPC error or isError. Every reservation is given back that can
// be; the errors are joined.
func Release(c Counters, rs []Reservation) error {
	var errs []error
	for _, r := range rs {
		if r.Amount == 0 {
			continue
		}
		if c == nil {
			return errNoCounters
		}
		if err := c.Release(r.Counter, r.At, r.Amount); err != nil {
			errs = append(errs, fmt.Errorf("release %s %q: %w", r.Kind, r.Name, err))
		}
	}
	return errors.Join(errs...)
}

var errNoCounters = errors.New("no counter store: a budget or rate limit cannot count")

// counter is what a budget and a rate limit share once compiled: where its
// counters are, and the window and limit they count in.
type counter struct {
	kind, name, field string
	// scope are the counter's parts before the principal's: its kind, and
	// where the rule is (a tool, or a grant), and its name; prefix is them
	// encoded, as key starts every key.
	scope  []string
	prefix string
	// perTool adds the call's server and tool to the counter's name.
	perTool bool
	limit   int64 // in counter units
	// window is as written, for denials; span and slot as counted.
	window     string
	span, slot time.Duration
}

// The windows a budget or rate limit may count over: from a second (a
// slot of at least 16ms) to a leap year.
const (
	minWindow = time.Second
	maxWindow = 366 * 24 * time.Hour
)

// newCounter validates what a budget and a rate limit share. limit is in
// counter units.
func newCounter(kind, field, name string, limit int64, window string, scope ...string) (counter, error) {
	span, err := time.ParseDuration(window)
	switch {
	case err != nil:
		return counter{}, fmt.Errorf("%s.window: %w (write it like 24h, 90m or 10s)", field, err)
	case span < minWindow || span > maxWindow:
		return counter{}, fmt.Errorf("%s.window: %s is not between %s and %s", field, window, minWindow, maxWindow)
	case limit <= 0 || limit > maxUnits:
		return counter{}, fmt.Errorf("%s.limit: must be positive and at most %d", field, maxUnits/Units)
	}
	span = span.Truncate(time.Millisecond)
	slot := (span + WindowSlots - 1) / WindowSlots
	slot = (slot + time.Millisecond - 1).Truncate(time.Millisecond)
	c := counter{
		kind: kind, name: name, field: field, scope: slices.Concat([]string{kind}, scope, []string{name}),
		limit: limit, window: window, span: span, slot: slot,
	}
	var b strings.Builder
	for _, p := range c.scope {
		writePart(&b, p)
	}
	c.prefix = b.String()
	return c, nil
}

// scope is what a counter of a rule at s is scoped by: the tool of a tool
// rule, or a grant.
func (s *Site) scope() []string {
	if s.Grant {
		return []string{"grant"}
	}
	return []string{"tool", s.Server, s.Tool}
}

// count claims c's name at s: a denial names one budget or rate limit, so
// a name is unique among a site's, and the grants of one principal rule
// share a counter by name, so theirs must count alike.
func (s *Site) count(c *counter) error {
	if prev, dup := s.counters[c.name]; dup {
		return fmt.Errorf("%s.name: %q is already the name of %s", c.field, c.name, prev)
	}
	s.counters[c.name] = c.field
	if s.shared == nil {
		return nil
	}
	prev, ok := s.shared[c.name]
	if !ok {
		s.shared[c.name] = c
		return nil
	}
	if prev.kind != c.kind || prev.limit != c.limit || prev.span != c.span || prev.perTool != c.perTool {
		per := ""
		if c.kind == KindRateLimit {
			per = " and per"
		}
		return fmt.Errorf("%s: %q is also the name of %s, which counts otherwise; grants of one rule share a counter by name, so give both the same kind, limit, window%s, or different names", c.field, c.name, prev.field, per)
	}
	return nil
}

// same reports whether o is c's counter, if perhaps with other terms: of
// the same kind, name, and tool rule or grant.
func (c *counter) same(o *counter) bool {
	return o.kind == c.kind && o.name == c.name && slices.Equal(o.scope, c.scope)
}

// looser lists how next counts more loosely than c.
func (c *counter) looser(next *counter) []string {
	what := c.what()
	var out []string
	if next.limit > c.limit {
		out = append(out, fmt.Sprintf("%s limit raised from %s to %s", what, units(c.limit), units(next.limit)))
	}
	if next.span < c.span {
		out = append(out, fmt.Sprintf("%s window shortened from %s to %s", what, c.window, next.window))
	}
	return out
}

// what names the budget or rate limit, for people.
func (c *counter) what() string {
	if c.kind == KindRateLimit {
		return fmt.Sprintf("rate limit %q", c.name)
	}
	return fmt.Sprintf("budget %q", c.name)
}

// describe says what the counter allows, for people.
func (c *counter) describe() string {
	per := "per principal"
	if c.perTool {
		per = "per principal and tool"
	}
	calls := ""
	if c.kind == KindRateLimit {
		calls = " calls"
	}
	return fmt.Sprintf("%s%s per %s, %s, on the %s", units(c.limit), calls, c.window, per, c.scope[1])
}

// key names the principal's counter of the call: the scope's parts, then
// the principal's (and the tool's), each length-prefixed so that no
// choice of names makes two counters one. It is on the path of every call
// under a limit, so it is built in one allocation.
func (c *counter) key(call Call) string {
	parts := [3]string{call.Principal, call.Server, call.Tool}
	n := 1
	if c.perTool {
		n = 3
	}
	size := len(c.prefix)
	for _, p := range parts[:n] {
		size += 21 + len(p) // the longest length prefix, its colon, the part
	}
	var b strings.Builder
	b.Grow(size)
	b.WriteString(c.prefix)
	for _, p := range parts[:n] {
		writePart(&b, p)
	}
	return b.String()
}

func writePart(b *strings.Builder, s string) {
	var num [20]byte
	b.Write(strconv.AppendInt(num[:0], int64(len(s)), 10))
	b.WriteByte(':')
	b.WriteString(s)
}

// taken is the charge of amount, in counter units, to the call's counter,
// under the highest limit there is, so that it always fits.
func (c *counter) taken(call Call, amount int64) (Charge, bool) {
	if amount < 0 || amount > maxUnits {
		return Charge{}, false
	}
	return Charge{Counter: c.key(call), Amount: amount, Limit: maxUnits, Window: c.span, Slot: c.slot}, true
}

// reserve takes amount from the call's counter, or denies the call for
// reason with what the planner needs to act.
func (c *counter) reserve(call Call, amount int64, reason deny.Reason) (Reservation, error) {
	if call.Counters == nil {
		return Reservation{}, fmt.Errorf("%s %q: %w", c.kind, c.name, errNoCounters)
	}
	key := c.key(call)
	u, err := call.Counters.Reserve(Charge{Counter: key, Amount: amount, Limit: c.limit, Window: c.span, Slot: c.slot})
	if err != nil {
		return Reservation{}, fmt.Errorf("%s %q: %w", c.kind, c.name, err)
	}
	if !u.Allowed {
		return Reservation{}, c.denial(reason, u, amount)
	}
	return Reservation{Kind: c.kind, Name: c.name, Counter: key, At: u.At, Amount: amount}, nil
}

// denial is the denial of a call whose amount does not fit.
func (c *counter) denial(reason deny.Reason, u Usage, amount int64) *deny.Error {
	info := &deny.LimitInfo{
		Name: c.name, Limit: fromUnits(c.limit), Used: fromUnits(u.Used), Amount: fromUnits(amount),
		WindowSeconds: int64(c.span / time.Second),
		// Rounded up: a caller that waits this long finds the slot gone.
		RetryAfterSeconds: int64((u.RetryAfter + time.Second - 1) / time.Second),
	}
	what := c.what()
	var detail string
	switch {
	case reason == deny.ConstraintViolation:
		detail = fmt.Sprintf("%s allows %s per %s; this call's %s is more than all of it, so no window can hold it", what, units(c.limit), c.window, units(amount))
	case u.RetryAfter > 0:
		detail = fmt.Sprintf("%s holds %s of %s per %s; this call's %s would exceed it: retry in %ds", what, units(u.Used), units(c.limit), c.window, units(amount), info.RetryAfterSeconds)
	default:
		detail = fmt.Sprintf("%s holds %s of %s per %s; this call's %s would exceed it", what, units(u.Used), units(c.limit), c.window, units(amount))
	}
	return &deny.Error{Reason: reason, Detail: detail, Limit: info}
}

func fromUnits(n int64) float64 { return float64(n) / Units }

func units(n int64) string { return strconv.FormatFloat(fromUnits(n), 'f', -1, 64) }

// toUnits converts an amount to counter units, rounding up whatever is
// finer than a thousandth, and never a positive amount to zero. It reads
// the amount as its shortest decimal (what the agent sent: 0.007 is 7, not
// the double's 7.000000000000001), so the rounding is exact at any size:
// 1000000.0004 is 1000000001, and 5e-324 is 1. An amount no counter holds
// is more than any limit. ok is false for a negative, NaN or infinite
// amount.
func toUnits(v float64) (n int64, ok bool) {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0) || v < 0:
		return 0, false
	case v > maxUnits/Units:
		return maxUnits + 1, true
	}
	whole, frac, _ := strings.Cut(strconv.FormatFloat(v, 'f', -1, 64), ".")
	n, err := strconv.ParseInt(whole, 10, 64)
	if err != nil {
		return maxUnits + 1, true
	}
	n *= Units
	for i, d := range frac {
		switch {
		case i < unitDigits:
			n += int64(d-'0') * pow10[unitDigits-1-i]
		case d != '0':
			return n + 1, true
		}
	}
	return n, true
}

// unitDigits is how many decimal places a unit holds (Units is 10^unitDigits).
const unitDigits = 3

var pow10 = [unitDigits]int64{1, 10, 100}
