package policy

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/deny"
)

func mustConstraint(t testing.TB, c Constraint) *Constraint {
	t.Helper()
	cs, err := compileConstraints("test", []Constraint{c})
	if err != nil {
		t.Fatal(err)
	}
	return cs[0]
}

// jsonArgs decodes arguments the way decide does: encoding/json into a
// map[string]any, numbers as json.Number.
func jsonArgs(t testing.TB, s string) map[string]any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var args map[string]any
	if err := dec.Decode(&args); err != nil {
		t.Fatal(err)
	}
	return args
}

func TestConstraintCheck(t *testing.T) {
	capped := Constraint{Name: "usd_cap_250", Expr: "args.amount <= 250", Message: "refunds are capped at USD 250"}
	reasons := Constraint{Name: "reason_allowlist", Expr: "args.reason_code in ['duplicate_charge', 'not_received', 'damaged']"}
	refund := func(args string) Input {
		return Input{Args: jsonArgs(t, args), Principal: "spiffe://acme/agent/support-refund", Server: "billing", Tool: "refund"}
	}
	tests := []struct {
		name string
		c    Constraint
		in   Input
		// want is "" when the constraint must hold, else a substring of
		// the violation's detail.
		want string
	}{
		{"under the cap", capped, refund(`{"amount": 40}`), ""},
		{"at the cap, integer JSON", capped, refund(`{"amount": 250}`), ""},
		{"at the cap, float JSON", capped, refund(`{"amount": 250.0}`), ""},
		{"at the cap, exponent JSON", capped, refund(`{"amount": 2.5e2}`), ""},
		{"a cent over", capped, refund(`{"amount": 250.01}`), `constraint "usd_cap_250" does not hold: refunds are capped at USD 250`},
		{"far over", capped, refund(`{"amount": 1e300}`), "does not hold"},
		{"negative", capped, refund(`{"amount": -5}`), ""},
		{"beyond any double", capped, refund(`{"amount": 1e400}`), "could not be evaluated (argument 1e400 is not a number CEL can hold"},
		{"Go float64", capped, Input{Args: map[string]any{"amount": 250.0}}, ""},
		{"Go float64 over", capped, Input{Args: map[string]any{"amount": 250.5}}, "does not hold"},
		{"Go int", capped, Input{Args: map[string]any{"amount": 250}}, ""},
		{"Go int over", capped, Input{Args: map[string]any{"amount": 251}}, "does not hold"},
		{"Go uint", capped, Input{Args: map[string]any{"amount": uint64(7)}}, ""},
		{"missing field", capped, refund(`{"order_id": "A-100"}`), `constraint "usd_cap_250" could not be evaluated (no such key: amount), so it does not hold: refunds are capped`},
		{"no arguments", capped, Input{}, "could not be evaluated"},
		{"string amount", capped, refund(`{"amount": "40"}`), "could not be evaluated (no such overload"},
		{"null amount", capped, refund(`{"amount": null}`), "could not be evaluated"},
		{"bool amount", capped, refund(`{"amount": true}`), "could not be evaluated"},
		{"object amount", capped, refund(`{"amount": {"value": 1}}`), "could not be evaluated"},

		{"listed reason", reasons, refund(`{"reason_code": "duplicate_charge"}`), ""},
		{"another listed reason", reasons, refund(`{"reason_code": "damaged"}`), ""},
		{"unlisted reason, no message: the expression is shown", reasons, refund(`{"reason_code": "vip_escalation"}`), `constraint "reason_allowlist" does not hold: args.reason_code in ['duplicate_charge'`},
		{"reason differs in case", reasons, refund(`{"reason_code": "Damaged"}`), "does not hold"},
		{"reason missing", reasons, refund(`{}`), "could not be evaluated"},
		{"reason of the wrong type", reasons, refund(`{"reason_code": 1}`), "does not hold"},

		{"principal", Constraint{Name: "p", Expr: "principal.startsWith('spiffe://acme/')"}, refund(`{}`), ""},
		{"other principal", Constraint{Name: "p", Expr: "principal.startsWith('spiffe://acme/')"}, Input{Principal: "spiffe://evil/acme"}, "does not hold"},
		{"server and tool", Constraint{Name: "st", Expr: "server == 'billing' && tool == 'refund'"}, refund(`{}`), ""},
		{"other server", Constraint{Name: "st", Expr: "server == 'billing' && tool == 'refund'"}, Input{Server: "payments", Tool: "refund"}, "does not hold"},
		{"equality across number types", Constraint{Name: "eq", Expr: "args.qty == 3"}, refund(`{"qty": 3}`), ""},
		{"double arithmetic", Constraint{Name: "a", Expr: "args.amount * 2.0 <= 500.0"}, refund(`{"amount": 250}`), ""},
		{"int arithmetic on a JSON number fails closed", Constraint{Name: "a", Expr: "args.amount + 1 <= 500"}, refund(`{"amount": 250}`), "could not be evaluated"},
		{"absent optional field", Constraint{Name: "f", Expr: "!has(args.skip_fraud_check) || args.skip_fraud_check == false"}, refund(`{"amount": 1}`), ""},
		{"consequential field set", Constraint{Name: "f", Expr: "!has(args.skip_fraud_check) || args.skip_fraud_check == false"}, refund(`{"skip_fraud_check": true}`), "does not hold"},
		{"every item", Constraint{Name: "items", Expr: "args.items.all(i, i.amount <= 100)"}, refund(`{"items": [{"amount": 10}, {"amount": 100}]}`), ""},
		{"one item over", Constraint{Name: "items", Expr: "args.items.all(i, i.amount <= 100)"}, refund(`{"items": [{"amount": 10}, {"amount": 101}]}`), "does not hold"},
		{"size", Constraint{Name: "len", Expr: "size(args.order_id) <= 16"}, refund(`{"order_id": "A-100"}`), ""},

		// Cost: a nested comprehension the policy wrote, and one the
		// arguments make expensive, both stop at the limit.
		{"pathological policy", Constraint{Name: "slow", Expr: "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, a + b + c + d > 0))))"}, Input{}, "could not be evaluated (cost limit 10000 exceeded)"},
		{"pathological arguments", Constraint{Name: "items", Expr: "args.items.all(i, i <= 100)"}, Input{Args: map[string]any{"items": manyItems(1 << 16)}}, "cost limit 10000 exceeded"},
		{"long string", Constraint{Name: "re", Expr: "args.s.matches('^(a|b)*c$')"}, Input{Args: map[string]any{"s": strings.Repeat("ab", 1<<18)}}, "cost limit 10000 exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := mustConstraint(t, tt.c).CheckInput(tt.in)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Check = %v, want it to hold", err)
				}
				return
			}
			de, ok := deny.As(err)
			if !ok || de.Reason != deny.ConstraintViolation {
				t.Fatalf("Check = %v, want a %s", err, deny.ConstraintViolation)
			}
			if !strings.Contains(de.Detail, tt.want) {
				t.Fatalf("detail %q does not contain %q", de.Detail, tt.want)
			}
		})
	}
}

func manyItems(n int) []any {
	items := make([]any, n)
	for i := range items {
		items[i] = float64(i % 100)
	}
	return items
}

// A Constraint straight from a File has no program: it must deny, never
// pass.
func TestUncompiledConstraintFailsClosed(t *testing.T) {
	c := Constraint{Name: "cap", Expr: "true"}
	if de, ok := deny.As(c.CheckInput(Input{})); !ok || de.Reason != deny.ConstraintViolation {
		t.Fatalf("uncompiled constraint: %v", c.CheckInput(Input{}))
	}
}

// Check runs concurrently on every call; a compiled program must be safe
// to share.
func TestConstraintCheckConcurrent(t *testing.T) {
	c := mustConstraint(t, Constraint{Name: "cap", Expr: "args.amount <= 250"})
	done := make(chan error, 8)
	for i := range 8 {
		go func() {
			var err error
			for j := range 200 {
				amount := float64(200 + (i+j)%100)
				got := c.CheckInput(Input{Args: map[string]any{"amount": amount}})
				if (got == nil) != (amount <= 250) {
					err = got
				}
			}
			done <- err
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// TestCostTrackedOnlyWhenItCouldExceed: a constraint is evaluated without
// the run-time cost limit only when its estimated worst case, over
// arguments of any size, is within it.
func TestCostTrackedOnlyWhenItCouldExceed(t *testing.T) {
	tests := []struct {
		expr    string
		tracked bool
	}{
		{"args.amount <= 250", false},
		{"args.reason_code in ['duplicate_charge', 'damaged']", false},
		{"principal == 'spiffe://acme/agent/support-refund' && args.amount > 0", false},
		{"args.s.matches('^(a|b)*c$')", true},
		{"args.s.startsWith(args.t)", true},
		{"args.items.all(i, i <= 100)", true},
		{"size(args.note) < 200", false},
	}
	for _, tt := range tests {
		c, err := compileConstraint(Constraint{Name: "c", Expr: tt.expr})
		if err != nil {
			t.Fatalf("%s: %v", tt.expr, err)
		}
		if c.expr.costTracked != tt.tracked {
			t.Errorf("%s: cost tracked = %v, want %v", tt.expr, c.expr.costTracked, tt.tracked)
		}
	}
}
