package policy

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/deny"
)

const support = "spiffe://acme/agent/support-refund"

// counters is a Counters that answers what it is told and keeps every
// charge and release.
type counters struct {
	charges  []Charge
	released []Reservation
	answer   func(Charge) Usage
	err      error
}

func (c *counters) Reserve(ch Charge) (Usage, error) {
	if c.err != nil {
		return Usage{}, c.err
	}
	c.charges = append(c.charges, ch)
	if c.answer != nil {
		return c.answer(ch), nil
	}
	return Usage{Allowed: true, At: time.UnixMilli(1000)}, nil
}

func (c *counters) Release(counter string, at time.Time, amount int64) error {
	c.released = append(c.released, Reservation{Counter: counter, At: at, Amount: amount})
	return c.err
}

func decide(t *testing.T, p *Policy, principal, server, tool string) Decision {
	t.Helper()
	d, err := p.Decide(principal, server, tool)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func termNames(d Decision) []string {
	var out []string
	for _, term := range d.Terms {
		switch term := term.(type) {
		case *Constraint:
			out = append(out, "constraint:"+term.Name)
		case *RateLimit:
			out = append(out, "rate_limit:"+term.Name)
		case *Budget:
			out = append(out, "budget:"+term.Name)
		case sequence:
			out = append(out, "sequence")
		}
	}
	return out
}

// The tool's limits, then the grant's; rate limits before budgets, and
// both, which can give back, before the sequence rule, which cannot.
func TestLimitTermsInOrder(t *testing.T) {
	p := mustLoad(t, "testdata/limits.yaml")
	tests := []struct {
		principal, server, tool string
		want                    []string
	}{
		{support, "billing", "refund", []string{"constraint:usd_cap_250", "rate_limit:refund_burst", "rate_limit:billing_calls", "budget:daily_refunds", "budget:money_out", "sequence"}},
		{support, "billing", "lookup_order", []string{"rate_limit:billing_calls", "budget:money_out", "sequence"}},
		{support, "payments", "refund", []string{"budget:daily_refunds", "budget:money_out"}},
		{"spiffe://acme/agent/other", "billing", "lookup_order", []string{"rate_limit:per_tool", "sequence"}},
	}
	for _, tt := range tests {
		d := decide(t, p, tt.principal, tt.server, tt.tool)
		if got := termNames(d); !slices.Equal(got, tt.want) {
			t.Errorf("%s/%s: terms %v, want %v", tt.server, tt.tool, got, tt.want)
		}
		for _, term := range d.Terms {
			_, reserves := term.(Reserver)
			_, isConstraint := term.(*Constraint)
			_, isSequence := term.(sequence)
			if term.Records() == isConstraint || reserves == (isConstraint || isSequence) {
				t.Errorf("%s/%s: %T records %v, reserves %v", tt.server, tt.tool, term, term.Records(), reserves)
			}
		}
	}
}

// Which calls share a counter: a tool's budget counts each principal's
// calls to it; a grant's, every tool it grants, and every grant of the
// rule with its name; a grant's rate limit per tool counts each tool
// apart, per principal all together.
func TestCounterKeys(t *testing.T) {
	p := mustLoad(t, "testdata/limits.yaml")
	const other = "spiffe://acme/agent/other"
	key := func(principal, server, tool, name string) string {
		t.Helper()
		d := decide(t, p, principal, server, tool)
		c := &counters{}
		args := map[string]any{"amount": 100.0}
		if server == "payments" {
			args["amount"] = "10000"
		}
		call := Call{Input: Input{Args: args, Principal: principal, Server: server, Tool: tool}, Counters: c}
		for _, term := range d.Terms {
			r, ok := term.(Reserver)
			if !ok {
				continue
			}
			res, err := r.Reserve(call)
			if err != nil {
				t.Fatalf("%s/%s %s: %v", server, tool, name, err)
			}
			if res.Name == name {
				return res.Counter
			}
		}
		t.Fatalf("%s/%s has no %s", server, tool, name)
		return ""
	}
	tests := []struct {
		name string
		a, b [4]string // principal, server, tool, limit
		same bool
	}{
		{"a tool's budget, per principal", [4]string{support, "billing", "refund", "daily_refunds"}, [4]string{other, "billing", "refund", "daily_refunds"}, false},
		{"two tools' budgets of one name", [4]string{support, "billing", "refund", "daily_refunds"}, [4]string{support, "payments", "refund", "daily_refunds"}, false},
		{"a grant's budget, across its tools", [4]string{support, "billing", "refund", "money_out"}, [4]string{support, "billing", "lookup_order", "money_out"}, true},
		{"a grant's budget, across the rule's grants", [4]string{support, "billing", "refund", "money_out"}, [4]string{support, "payments", "refund", "money_out"}, true},
		{"a rate limit per principal", [4]string{support, "billing", "refund", "billing_calls"}, [4]string{support, "billing", "lookup_order", "billing_calls"}, true},
		{"a rate limit per tool", [4]string{other, "billing", "refund", "per_tool"}, [4]string{other, "billing", "lookup_order", "per_tool"}, false},
	}
	for _, tt := range tests {
		a, b := key(tt.a[0], tt.a[1], tt.a[2], tt.a[3]), key(tt.b[0], tt.b[1], tt.b[2], tt.b[3])
		if (a == b) != tt.same {
			t.Errorf("%s: counters %q and %q, want same=%v", tt.name, a, b, tt.same)
		}
	}
}

// What a budget takes, and what it denies before it asks the store: an
// amount it cannot evaluate, that is no number, is negative, or is more
// than the whole limit.
func TestBudgetAmount(t *testing.T) {
	p := mustLoad(t, "testdata/limits.yaml")
	refund := budgetsOf(decide(t, p, support, "billing", "refund"))[0]
	cents := budgetsOf(decide(t, p, support, "payments", "refund"))[0]
	tests := []struct {
		name   string
		budget *Budget
		args   string
		want   int64  // counter units taken, when allowed
		denied string // in the detail of a constraint_violation
	}{
		{"a whole amount", refund, `{"amount": 200}`, 200_000, ""},
		{"thousandths, exact", refund, `{"amount": 0.007}`, 7, ""},
		{"finer, rounded up", refund, `{"amount": 0.0071}`, 8, ""},
		{"zero", refund, `{"amount": 0}`, 0, ""},
		{"tiny, never zero", refund, `{"amount": 1e-12}`, 1, ""},
		{"the least double", refund, `{"amount": 5e-324}`, 1, ""},
		{"the whole limit", refund, `{"amount": 500}`, 500_000, ""},
		{"an int expression", cents, `{"amount": "20000"}`, 200_000, ""},
		{"missing", refund, `{"amount_usd": 200}`, 0, "could not be evaluated on the call's arguments (no such key: amount)"},
		{"a string", refund, `{"amount": "200"}`, 0, `is 200, a string, not a number`},
		{"negative", refund, `{"amount": -200}`, 0, "is -200; an amount is a number of at least 0"},
		{"more than the limit", refund, `{"amount": 500.001}`, 0, `budget "daily_refunds" allows 500 per 24h; this call's 500.001 is more than all of it`},
		{"more than any counter", refund, `{"amount": 1e300}`, 0, "is more than all of it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &counters{}
			res, err := tt.budget.Reserve(Call{Input: Input{Args: jsonArgs(t, tt.args), Principal: support}, Counters: c})
			if tt.denied != "" {
				de, ok := deny.As(err)
				if !ok || de.Reason != deny.ConstraintViolation || !strings.Contains(de.Detail, tt.denied) {
					t.Fatalf("error %v, want constraint_violation with %q", err, tt.denied)
				}
				if len(c.charges) != 0 {
					t.Fatalf("a call denied for its amount asked the store: %+v", c.charges)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(c.charges) != 1 || c.charges[0].Amount != tt.want || res.Amount != tt.want {
				t.Fatalf("charged %+v, reserved %d; want %d", c.charges, res.Amount, tt.want)
			}
			if ch := c.charges[0]; ch.Limit != 500_000 || ch.Window != 24*time.Hour || ch.Slot != 24*time.Minute {
				t.Fatalf("charge %+v, want a limit of 500 over 24h in slots of 24m", ch)
			}
		})
	}
}

// A call that does not fit is denied with what the planner needs: the
// limit's name, limit, use, window and when to retry, in the policy's
// units.
func TestLimitDenials(t *testing.T) {
	p := mustLoad(t, "testdata/limits.yaml")
	d := decide(t, p, support, "billing", "refund")
	full := &counters{answer: func(c Charge) Usage {
		return Usage{Used: c.Limit - c.Amount/2, RetryAfter: 80640*time.Second - time.Millisecond}
	}}
	call := Call{Input: Input{Args: jsonArgs(t, `{"amount": 200}`), Principal: support, Server: "billing", Tool: "refund"}, Counters: full}
	tests := []struct {
		term   Term
		reason deny.Reason
		want   deny.LimitInfo
		detail string
	}{
		{budgetsOf(d)[0], deny.BudgetExhausted,
			deny.LimitInfo{Name: "daily_refunds", Limit: 500, Used: 400, Amount: 200, WindowSeconds: 86400, RetryAfterSeconds: 80640},
			`budget "daily_refunds" holds 400 of 500 per 24h; this call's 200 would exceed it: retry in 80640s`},
		{rateLimitsOf(d)[0], deny.RateLimited,
			deny.LimitInfo{Name: "refund_burst", Limit: 10, Used: 9.5, Amount: 1, WindowSeconds: 60, RetryAfterSeconds: 80640},
			`rate limit "refund_burst" holds 9.5 of 10 per 1m`},
	}
	for _, tt := range tests {
		err := tt.term.Check(call)
		de, ok := deny.As(err)
		if !ok || de.Reason != tt.reason || de.Limit == nil || *de.Limit != tt.want || !strings.Contains(de.Detail, tt.detail) {
			t.Errorf("%T: %v (limit %+v), want %s with %+v and %q", tt.term, err, de.Limit, tt.reason, tt.want, tt.detail)
		}
	}
}

// Without a counter store, or with one that fails, a call under a limit
// fails closed with an error that is no denial: the core denies it
// store_unavailable.
func TestLimitsFailClosed(t *testing.T) {
	p := mustLoad(t, "testdata/limits.yaml")
	d := decide(t, p, support, "billing", "refund")
	down := errors.New("store down")
	args := jsonArgs(t, `{"amount": 200}`)
	for _, c := range []Counters{nil, &counters{err: down}} {
		for _, term := range []Term{budgetsOf(d)[0], rateLimitsOf(d)[0]} {
			err := term.Check(Call{Input: Input{Args: args, Principal: support}, Counters: c})
			if _, denial := deny.As(err); err == nil || denial {
				t.Errorf("%T with counters %v: %v, want the store's error", term, c, err)
			}
			if c != nil && !errors.Is(err, down) {
				t.Errorf("%T: %v does not wrap the store's error", term, err)
			}
		}
	}
}

// Record takes what each limit reserves, in order, and gives it all back
// when a later term denies the call or fails: a denied call takes nothing.
func TestRecordGivesBackWhatADeniedCallTook(t *testing.T) {
	p := mustLoad(t, "testdata/limits.yaml")
	d := decide(t, p, support, "billing", "refund")
	args := jsonArgs(t, `{"amount": 200}`)
	down := errors.New("store down")
	tests := []struct {
		name string
		// deny is the name of the limit that denies, if one does.
		deny     string
		followed bool  // the sequence rule holds
		logErr   error // the call log fails
		want     deny.Reason
		taken    []string // the names reserved and kept
		released int
	}{
		{"allowed", "", true, nil, "", []string{"refund_burst", "billing_calls", "daily_refunds", "money_out"}, 0},
		{"the second rate limit denies", "billing_calls", true, nil, deny.RateLimited, nil, 1},
		{"the last budget denies", "money_out", true, nil, deny.BudgetExhausted, nil, 3},
		{"the sequence rule denies", "", false, nil, deny.SequenceViolation, nil, 4},
		{"the call log fails", "", true, down, "", nil, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &counters{answer: func(ch Charge) Usage {
				if tt.deny != "" && strings.Contains(ch.Counter, tt.deny) {
					return Usage{Used: ch.Limit, RetryAfter: time.Second}
				}
				return Usage{Allowed: true, At: time.UnixMilli(int64(1000 * len(ch.Counter)))}
			}}
			l := &log{called: map[string]bool{"lookup_order": tt.followed}, err: tt.logErr}
			call := Call{Input: Input{Args: args, Principal: support, Server: "billing", Tool: "refund"}, Snapshot: "ep_1", Log: l, Counters: c}
			taken, err := Record(d.Terms, call)
			de, isDenial := deny.As(err)
			switch {
			case tt.logErr != nil:
				if !errors.Is(err, tt.logErr) || isDenial {
					t.Fatalf("error %v, want the call log's", err)
				}
			case tt.want != "":
				if !isDenial || de.Reason != tt.want {
					t.Fatalf("error %v, want %s", err, tt.want)
				}
			case err != nil:
				t.Fatal(err)
			}
			var names []string
			for _, r := range taken {
				names = append(names, r.Name)
			}
			if !slices.Equal(names, tt.taken) {
				t.Fatalf("kept %v, want %v", names, tt.taken)
			}
			if len(c.released) != tt.released {
				t.Fatalf("gave back %d reservations, want %d", len(c.released), tt.released)
			}
			for _, r := range c.released {
				i := slices.IndexFunc(c.charges, func(ch Charge) bool { return ch.Counter == r.Counter })
				if i < 0 || c.charges[i].Amount != r.Amount || !r.At.Equal(time.UnixMilli(int64(1000*len(r.Counter)))) {
					t.Fatalf("gave back %+v, which was not taken so", r)
				}
			}
		})
	}
}

// What Taken charges is what the same rule's Reserve takes from, for the
// same principal and tool: a test that fills a counter with it fills the
// one the call is decided on. An amount no counter holds is refused.
func TestTaken(t *testing.T) {
	p := mustLoad(t, "testdata/limits.yaml")
	d := decide(t, p, support, "billing", "refund")
	call := Call{Input: Input{Args: jsonArgs(t, `{"amount": 200}`), Principal: support, Server: "billing", Tool: "refund"}}
	tests := []struct {
		term   Counted
		amount float64
		want   int64 // counter units
		field  string
	}{
		{budgetsOf(d)[0], 400, 400_000, "tools[0].budgets[0]"},
		{budgetsOf(d)[1], 0.0015, 2, "principals[0].grants[0].budgets[0]"},
		{rateLimitsOf(d)[0], 9, 9_000, "tools[0].rate_limits[0]"},
		{rateLimitsOf(d)[1], 0, 0, "principals[0].grants[0].rate_limits[0]"},
	}
	for _, tt := range tests {
		name, field := tt.term.Names()
		t.Run(name, func(t *testing.T) {
			if field != tt.field {
				t.Errorf("field %q, want %q", field, tt.field)
			}
			ch, ok := tt.term.Taken(call, tt.amount)
			if !ok || ch.Amount != tt.want {
				t.Fatalf("Taken(%v) = %+v, %t; want %d units", tt.amount, ch, ok, tt.want)
			}
			c := &counters{}
			call := call
			call.Counters = c
			if _, err := tt.term.Reserve(call); err != nil {
				t.Fatal(err)
			}
			r := c.charges[0]
			if ch.Counter != r.Counter || ch.Window != r.Window || ch.Slot != r.Slot || ch.Limit < r.Limit {
				t.Errorf("Taken charges %+v, Reserve %+v", ch, r)
			}
		})
	}
	budget, limit := budgetsOf(d)[0], rateLimitsOf(d)[0]
	for _, tt := range []struct {
		term   Counted
		amount float64
	}{{budget, -1}, {budget, math.NaN()}, {budget, math.Inf(1)}, {budget, 1e16}, {limit, 1.5}, {limit, -1}, {limit, 1e13}} {
		if ch, ok := tt.term.Taken(call, tt.amount); ok {
			t.Errorf("%T Taken(%v) = %+v, want refused", tt.term, tt.amount, ch)
		}
	}
}
