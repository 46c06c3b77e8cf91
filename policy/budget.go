package policy

import (
	"fmt"
	"slices"
	"strings"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"go.yaml.in/yaml/v3"

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

var (
	_ Reserver   = (*Budget)(nil)
	_ Prechecker = (*Budget)(nil)
)

func init() { register(budgetKind{}) }

// budgetKind is budgets: sums over each principal's allowed calls in a
// window, on a tool rule and on a grant, the tool's first. They record,
// and can give back, so they run after the rate limits (a call a rate
// limit denies then never holds budget another call could have had).
type budgetKind struct{}

func (budgetKind) Key() string   { return "budgets" }
func (budgetKind) Stage() int    { return 30 }
func (budgetKind) OnGrant() bool { return true }

func (budgetKind) Compile(s *Site, value *yaml.Node) (Rules, error) {
	var bs []Budget
	if err := s.Decode("budgets", value, &bs); err != nil {
		return nil, err
	}
	var out budgets
	for i, b := range bs {
		cb, err := compileBudget(fmt.Sprintf("%s[%d]", s.At("budgets"), i), b, s.scope()...)
		if err != nil {
			return nil, err
		}
		if err := s.count(&cb.c); err != nil {
			return nil, err
		}
		out = append(out, cb)
	}
	return out, nil
}

func (budgetKind) Apply(tool, grant Rules) Applied {
	return budgets(slices.Concat(tool.(budgets), grant.(budgets)))
}

// budgets are a site's budgets, or those that apply to a call.
type budgets []*Budget

// A budget's window is digested as counted, so that 24h and 1440m are one
// window.
type digestedBudget struct {
	Name   string  `json:"name"`
	Amount string  `json:"amount"`
	Limit  float64 `json:"limit"`
	Window string  `json:"window"`
}

// Digested implements Rules: none leaves the key out.
func (bs budgets) Digested() any {
	if len(bs) == 0 {
		return nil
	}
	var out []digestedBudget
	for _, b := range bs {
		out = append(out, digestedBudget{Name: b.Name, Amount: b.Amount, Limit: b.Limit, Window: b.c.span.String()})
	}
	return out
}

// Reads implements Rules: each amount.
func (bs budgets) Reads() []Reading {
	var out []Reading
	for _, b := range bs {
		out = append(out, Reading{Field: b.c.field + ".amount", expr: b.amount, Guard: "write has(args.%[1]s) ? args.%[1]s : 0, or move the budget to the tool"})
	}
	return out
}

func (bs budgets) spans() []string {
	var out []string
	for _, b := range bs {
		out = append(out, fmt.Sprintf("budget %q: the sum of %s, at most %s", b.Name, b.Amount, b.c.describe()))
	}
	return out
}

// Terms implements Applied.
func (bs budgets) Terms() []Term { return termsOf(bs) }

// Looser implements Applied: a budget removed (or renamed: a new name is
// a new counter, from nothing), its limit raised, its window shortened
// (the same limit over less time allows more a day), or its amount
// changed in any way.
func (bs budgets) Looser(next Applied) []string {
	return looserLimits(bs, next.(budgets), (*Budget).counts, func(o, n *Budget) []string {
		if n.Amount != o.Amount {
			return []string{fmt.Sprintf("budget %q amount changed from %q to %q", o.Name, o.Amount, n.Amount)}
		}
		return nil
	})
}

// Explain implements Applied: what the call would take of each; whether
// that fits is the counter's to say.
func (bs budgets) Explain(call Call) Explanation {
	var e Explanation
	switch {
	case len(bs) == 0:
		e.Lines = append(e.Lines, "no budgets")
		return e
	case call.Args == nil:
		e.Decides = "budgets"
		e.Otherwise = []deny.Reason{deny.ConstraintViolation}
	}
	e.Unless = "its budgets have room"
	e.Otherwise = append(e.Otherwise, deny.BudgetExhausted)
	for _, b := range bs {
		line := fmt.Sprintf("budget %q (%s): the sum of %s, at most %s: ", b.Name, b.c.field, b.Amount, b.c.describe())
		if call.Args == nil {
			e.Lines = append(e.Lines, line+"not evaluated, no arguments given")
			continue
		}
		amount, err := b.amountOf(call.Input)
		if err != nil {
			de, _ := deny.As(err)
			e.Lines = append(e.Lines, line+"DENIES THE CALL: "+de.Detail)
			e.Denials = append(e.Denials, Denial{b.Name, de.Reason})
			continue
		}
		e.Lines = append(e.Lines, line+"this call would take "+units(amount))
	}
	return e
}

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

// Names implements Counted.
func (b *Budget) Names() (name, field string) { return b.Name, b.c.field }

// Taken implements Counted: amount in the budget's units, exact to three
// decimal places as a call's is.
func (b *Budget) Taken(call Call, amount float64) (Charge, bool) {
	n, ok := toUnits(amount)
	if !ok {
		return Charge{}, false
	}
	return b.c.taken(call, n)
}

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

// Precheck implements Prechecker: CheckInput, unless no arguments are
// known (nil Args).
func (b *Budget) Precheck(call Call) error {
	if call.Args == nil {
		return nil
	}
	return b.CheckInput(call.Input)
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
