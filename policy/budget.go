package policy

import (
	"fmt"
	"strings"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"

	"github.com/capsnap/capsnap/deny"
)

// Budget is a named sum over a principal's allowed calls in a window: the
// daily cap. On a tool rule it sums the principal's calls to that tool; on
// a grant, its calls to every tool the grant grants, together. A call is
// allowed only if its amount fits in what the window has left, and takes
// it as it is allowed (Counters). In a File it is only text; Compile
// returns compiled ones.
type Budget struct {
	// Name is the budget's counter: unique among a tool's budgets and
	// rate limits, and among a principal rule's grants' unless the same
	// limit and window (then their calls share the counter). A renamed
	// budget starts from nothing.
	Name string `yaml:"name" json:"name"`
	// Amount is a CEL expression over the call, as a constraint's, that
	// evaluates to a number of at least 0: what the call takes, e.g.
	// args.amount. A call it fails on, or gives anything else for, is
	// denied constraint_violation.
	Amount string `yaml:"amount" json:"amount"`
	// Limit is the most the window may hold, in the amount's units,
	// exact to three decimal places (Units).
	Limit float64 `yaml:"limit" json:"limit"`
	// Window is how far back the budget sums: a duration from 1s to
	// 8784h, e.g. 24h (Counters says how it is counted).
	Window string `yaml:"window" json:"window"`

	amount *expression
	c      counter
}

var _ Reserver = (*Budget)(nil)

func compileBudget(field string, b Budget, scope ...string) (*Budget, error) {
	if strings.TrimSpace(b.Name) == "" {
		return nil, fmt.Errorf("%s.name: required", field)
	}
	if strings.TrimSpace(b.Amount) == "" {
		return nil, fmt.Errorf("%s.amount: required", field)
	}
	amount, err := compileExpression(b.Amount, func(t *cel.Type) error {
		for _, ok := range []*cel.Type{cel.DoubleType, cel.IntType, cel.UintType, cel.DynType} {
			if t.IsExactType(ok) {
				return nil
			}
		}
		return fmt.Errorf("%q is of type %s, want a number", b.Amount, t)
	})
	if err != nil {
		return nil, fmt.Errorf("%s.amount: %w", field, err)
	}
	limit, ok := toUnits(b.Limit)
	if !ok || limit > maxUnits {
		limit = -1 // newCounter says what a limit must be
	}
	c, err := newCounter(KindBudget, field, b.Name, limit, b.Window, scope...)
	if err != nil {
		return nil, err
	}
	b.amount, b.c = amount, c
	return &b, nil
}

func (b *Budget) counts() *counter { return &b.c }

// Check implements Term: Reserve, the reservation dropped.
func (b *Budget) Check(call Call) error {
	_, err := b.Reserve(call)
	return err
}

// Records implements Term: an allowed call takes its amount.
func (*Budget) Records() bool { return true }

// Reserve implements Reserver: the call's amount, taken from the
// principal's counter if it fits. A call CheckInput denies is denied
// before the counter is asked; one that does not fit in what is left,
// deny.BudgetExhausted with when it will.
func (b *Budget) Reserve(call Call) (Reservation, error) {
	amount, err := b.amountOf(call.Input)
	if err != nil {
		return Reservation{}, err
	}
	return b.c.reserve(call, amount, deny.BudgetExhausted)
}

// CheckInput is what the budget says of a call without its counter: nil
// if it could fit in an empty window, else a deny.ConstraintViolation,
// for an amount that cannot be evaluated, is not a number of at least 0,
// or is more than the whole limit.
func (b *Budget) CheckInput(in Input) error {
	_, err := b.amountOf(in)
	return err
}

// amountOf evaluates the budget's amount over in, in counter units, and
// denies one no window could hold.
func (b *Budget) amountOf(in Input) (int64, error) {
	v, err := b.amount.eval(in)
	if err != nil {
		return 0, deny.Errorf(deny.ConstraintViolation, "budget %q: its amount %s could not be evaluated on the call's arguments (%v), so the call cannot be counted", b.Name, b.Amount, err)
	}
	f, ok := number(v)
	if !ok {
		return 0, deny.Errorf(deny.ConstraintViolation, "budget %q: its amount %s is %v, a %s, not a number", b.Name, b.Amount, v.Value(), v.Type().TypeName())
	}
	n, ok := toUnits(f)
	if !ok {
		return 0, deny.Errorf(deny.ConstraintViolation, "budget %q: its amount %s is %v; an amount is a number of at least 0", b.Name, b.Amount, f)
	}
	if n > b.c.limit {
		return 0, b.c.denial(deny.ConstraintViolation, Usage{}, n)
	}
	return n, nil
}

func number(v ref.Val) (float64, bool) {
	switch v := v.(type) {
	case types.Double:
		return float64(v), true
	case types.Int:
		return float64(v), true
	case types.Uint:
		return float64(v), true
	}
	return 0, false
}
