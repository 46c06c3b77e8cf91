package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
	celast "cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/interpreter"
	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/deny"
)

// MaxConstraintCost bounds the CEL cost of evaluating one constraint (about
// one unit per operation, more for work over strings and lists), so that
// neither a hostile policy nor hostile arguments can make a Check slow. An
// ordinary limit or allowlist costs well under 100; evaluation stops, and the
// constraint fails, past this.
const MaxConstraintCost = 10_000

// Constraint is a named CEL expression over a call that must evaluate to
// true. In a File it is only text; Compile returns compiled ones.
type Constraint struct {
	Name string `yaml:"name" json:"name"`
	Expr string `yaml:"expr" json:"expr"`
	// Message, when set, is shown to a caller the constraint denies.
	Message string `yaml:"message,omitempty" json:"message,omitempty"`

	expr  *expression
	field string
}

// expression is a compiled CEL expression over a call: a constraint's, or
// a budget's amount.
type expression struct {
	prog cel.Program
	// costTracked is whether evaluation counts cost against
	// MaxConstraintCost: only if it could exceed it.
	costTracked bool
	// read are the args fields the expression reads outright, and tested
	// those it only tests with has(), each sorted: a call without one it
	// reads makes it fail, and one it tests that the tool's input schema
	// does not declare is a typo (Lint, LintArguments).
	read, tested []string
}

// Input is what a constraint is evaluated over.
type Input struct {
	// Args are the call's arguments as encoding/json decodes them into a
	// map[string]any: objects map[string]any, arrays []any, and numbers
	// json.Number (UseNumber, as JSON Schema validation decodes them, so
	// that one decode serves both) or float64. CEL sees every JSON number
	// as a double. nil is no arguments.
	Args      map[string]any
	Principal string
	Server    string
	Tool      string
}

// celEnv declares the variables a constraint may use. Building it is
// costly, and it is immutable, so there is one.
var celEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("args", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("principal", cel.StringType),
		cel.Variable("server", cel.StringType),
		cel.Variable("tool", cel.StringType),
		// Arguments arrive as JSON, where every number is a double; this
		// lets args.amount <= 250 compare a double with an int literal.
		cel.CrossTypeNumericComparisons(true),
		cel.CustomTypeAdapter(jsonAdapter{}),
	)
})

// jsonAdapter hands CEL arguments decoded with json.Number: each number
// becomes the double a float64 decode would give, and a number no double
// can hold is an error, so the constraint fails closed. Objects and arrays
// keep this adapter for what they hold.
type jsonAdapter struct{}

func (a jsonAdapter) NativeToValue(v any) ref.Val {
	switch v := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return types.NewErr("argument %s is not a number CEL can hold: %v", v, err)
		}
		return types.Double(f)
	case map[string]any:
		return types.NewStringInterfaceMap(a, v)
	case []any:
		return types.NewDynamicList(a, v)
	}
	return types.DefaultTypeAdapter.NativeToValue(v)
}

func init() { register(constraintKind{}) }

// constraintKind is constraints: CEL over the call that must hold, on a
// tool rule and on a grant, the tool's first. They only read the call, so
// they run first of all.
type constraintKind struct{}

func (constraintKind) Key() string   { return "constraints" }
func (constraintKind) Stage() int    { return 10 }
func (constraintKind) OnGrant() bool { return true }

func (constraintKind) Compile(s *Site, value *yaml.Node) (Rules, error) {
	var cs []Constraint
	if err := s.Decode("constraints", value, &cs); err != nil {
		return nil, err
	}
	compiled, err := compileConstraints(s.At("constraints"), cs)
	return constraints(compiled), err
}

func (constraintKind) Apply(tool, grant Rules) Applied {
	return constraints(slices.Concat(tool.(constraints), grant.(constraints)))
}

// constraints are a site's constraints, or those that apply to a call.
type constraints []*Constraint

type digestedConstraint struct {
	Name    string `json:"name"`
	Expr    string `json:"expr"`
	Message string `json:"message"`
}

// Digested implements Rules: always a list, so that "none" is spelt one
// way.
func (cs constraints) Digested() any {
	out := make([]digestedConstraint, 0, len(cs))
	for _, c := range cs {
		out = append(out, digestedConstraint{Name: c.Name, Expr: c.Expr, Message: c.Message})
	}
	return out
}

// Reads implements Rules.
func (cs constraints) Reads() []Reading {
	var out []Reading
	for _, c := range cs {
		out = append(out, Reading{Field: c.field + ".expr", expr: c.expr, Guard: "guard it with has(args.%[1]s), or move it to the tool"})
	}
	return out
}

// Terms implements Applied.
func (cs constraints) Terms() []Term { return termsOf(cs) }

// Looser implements Applied: a constraint removed or changed in any way
// (whether "<= 300" is looser than "<= 250" is not decided by reading
// CEL).
func (cs constraints) Looser(next Applied) []string {
	n := next.(constraints)
	var out []string
	for _, c := range cs {
		if slices.ContainsFunc(n, c.same) {
			continue
		}
		i := slices.IndexFunc(n, func(x *Constraint) bool { return x.Name == c.Name })
		switch {
		case i < 0:
			out = append(out, fmt.Sprintf("constraint %q (%s) removed", c.Name, c.Expr))
		case n[i].Expr != c.Expr:
			out = append(out, fmt.Sprintf("constraint %q changed from %q to %q", c.Name, c.Expr, n[i].Expr))
		default:
			out = append(out, fmt.Sprintf("constraint %q message changed from %q to %q", c.Name, c.Message, n[i].Message))
		}
	}
	return out
}

func (c *Constraint) same(o *Constraint) bool {
	return c.Name == o.Name && c.Expr == o.Expr && c.Message == o.Message
}

// Explain implements Applied: whether each holds for the call.
func (cs constraints) Explain(call Call) Explanation {
	var e Explanation
	if len(cs) == 0 {
		e.Lines = append(e.Lines, "no constraints")
	} else if call.Args == nil {
		e.Decides = "constraints"
		e.Otherwise = []deny.Reason{deny.ConstraintViolation}
	}
	for _, c := range cs {
		line := fmt.Sprintf("constraint %q (%s): %s: ", c.Name, c.field, c.Expr)
		message := ""
		if c.Message != "" {
			message = ": " + c.Message
		}
		if call.Args == nil {
			e.Lines = append(e.Lines, line+"not evaluated, no arguments given")
			continue
		}
		switch holds, err := c.eval(call.Input); {
		case err != nil:
			e.Lines = append(e.Lines, fmt.Sprintf("%sDOES NOT HOLD, its evaluation failed (%v)%s", line, err, message))
			e.Denials = append(e.Denials, Denial{c.Name, deny.ConstraintViolation})
		case !holds:
			e.Lines = append(e.Lines, line+"DOES NOT HOLD"+message)
			e.Denials = append(e.Denials, Denial{c.Name, deny.ConstraintViolation})
		default:
			e.Lines = append(e.Lines, line+"holds")
		}
	}
	return e
}

func compileConstraints(field string, cs []Constraint) ([]*Constraint, error) {
	out := make([]*Constraint, 0, len(cs))
	seen := map[string]bool{}
	for i, c := range cs {
		cf := fmt.Sprintf("%s[%d]", field, i)
		if strings.TrimSpace(c.Name) == "" {
			return nil, fmt.Errorf("%s.name: required", cf)
		}
		if seen[c.Name] {
			return nil, fmt.Errorf("%s.name: %q is used twice", cf, c.Name)
		}
		seen[c.Name] = true
		if strings.TrimSpace(c.Expr) == "" {
			return nil, fmt.Errorf("%s.expr: required", cf)
		}
		compiled, err := compileConstraint(c)
		if err != nil {
			return nil, fmt.Errorf("%s.expr: %w", cf, err)
		}
		compiled.field = cf
		out = append(out, compiled)
	}
	return out, nil
}

func compileConstraint(c Constraint) (*Constraint, error) {
	e, err := compileExpression(c.Expr, func(t *cel.Type) error {
		// A constraint of type dyn could be true, false or something
		// else only at run time; require the operator to say what holds.
		if !t.IsExactType(cel.BoolType) {
			return fmt.Errorf("%q is of type %s, want bool (compare explicitly, e.g. args.flag == true)", c.Expr, t)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &Constraint{Name: c.Name, Expr: c.Expr, Message: c.Message, expr: e}, nil
}

// compileExpression compiles src over a call's variables, and holds its
// type to what check accepts.
func compileExpression(src string, check func(*cel.Type) error) (*expression, error) {
	env, err := celEnv()
	if err != nil {
		return nil, fmt.Errorf("cel environment: %w", err)
	}
	checked, iss := env.Compile(src)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	if err := check(checked.OutputType()); err != nil {
		return nil, err
	}
	// Folds constants, e.g. turns "x in [...]" into a set lookup.
	opts := []cel.ProgramOption{cel.EvalOptions(cel.OptOptimize)}
	// Tracking cost at run time is a third of an ordinary constraint's
	// evaluation. An expression whose worst case, over arguments of any
	// size (the estimate assumes unbounded ones), is within the limit
	// cannot exceed it, so only the others are tracked.
	est, err := env.EstimateCost(checked, unsized{})
	tracked := err != nil || est.Max > MaxConstraintCost
	if tracked {
		opts = append(opts, cel.CostLimit(MaxConstraintCost))
	}
	prog, err := env.Program(checked, opts...)
	if err != nil {
		return nil, err
	}
	read, tested := argFields(checked)
	return &expression{prog: prog, costTracked: tracked, read: read, tested: tested}, nil
}

// unsized knows nothing of sizes or calls, so the estimate takes each
// argument to be as large as can be.
type unsized struct{}

func (unsized) EstimateCallCost(string, string, *cost.AstNode, []cost.AstNode) *cost.CallEstimate {
	return nil
}
func (unsized) EstimateSize(cost.AstNode) *cost.SizeEstimate { return nil }

// argFields lists the fields of args an expression reads without ever
// testing them with has() (those that make it fail on a call without
// them), and those it only tests, as args.x or args["x"].
func argFields(checked *cel.Ast) (read, tested []string) {
	isTested := map[string]bool{}
	celast.PreOrderVisit(checked.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		switch e.Kind() {
		case celast.SelectKind:
			s := e.AsSelect()
			if !isArgs(s.Operand()) {
				return
			}
			if s.IsTestOnly() {
				isTested[s.FieldName()] = true
				return
			}
			read = append(read, s.FieldName())
		case celast.CallKind:
			c := e.AsCall()
			if c.FunctionName() != "_[_]" || len(c.Args()) != 2 || !isArgs(c.Args()[0]) || c.Args()[1].Kind() != celast.LiteralKind {
				return
			}
			if key, ok := c.Args()[1].AsLiteral().Value().(string); ok {
				read = append(read, key)
			}
		}
	}))
	read = slices.DeleteFunc(read, func(f string) bool { return isTested[f] })
	slices.Sort(read)
	for f := range isTested {
		tested = append(tested, f)
	}
	slices.Sort(tested)
	return slices.Compact(read), tested
}

func isArgs(e celast.Expr) bool {
	return e.Kind() == celast.IdentKind && e.AsIdent() == "args"
}

var _ Prechecker = (*Constraint)(nil)

// Check implements Term: CheckInput over the call.
func (c *Constraint) Check(call Call) error { return c.CheckInput(call.Input) }

// Precheck implements Prechecker: a constraint reads only the call. With
// no arguments known (nil Args) it is not evaluated.
func (c *Constraint) Precheck(call Call) error {
	if call.Args == nil {
		return nil
	}
	return c.CheckInput(call.Input)
}

// Records implements Term: a constraint reads only the call.
func (*Constraint) Records() bool { return false }

// CheckInput evaluates the constraint over in: nil if it holds, else a
// *deny.Error with deny.ConstraintViolation naming the constraint. An
// evaluation that fails (a missing argument, a wrong type, the cost limit)
// is a violation too: constraints fail closed.
func (c *Constraint) CheckInput(in Input) error {
	holds, err := c.eval(in)
	switch {
	case err != nil:
		return deny.Errorf(deny.ConstraintViolation, "constraint %q could not be evaluated (%v), so it does not hold%s", c.Name, err, c.because())
	case !holds:
		return deny.Errorf(deny.ConstraintViolation, "constraint %q does not hold%s", c.Name, c.because())
	}
	return nil
}

// eval says whether the constraint holds for in, or why it could not tell.
func (c *Constraint) eval(in Input) (bool, error) {
	if c.expr == nil {
		return false, errors.New("never compiled")
	}
	out, err := c.expr.eval(in)
	if err != nil {
		return false, err
	}
	return out == types.True, nil
}

// eval evaluates e over in.
func (e *expression) eval(in Input) (ref.Val, error) {
	a := activations.Get().(*activation)
	a.in = in
	out, _, err := e.prog.Eval(a)
	*a = activation{}
	activations.Put(a)
	if err != nil {
		var cancelled interpreter.EvalCancelledError
		if errors.As(err, &cancelled) && cancelled.Cause == interpreter.CostLimitExceeded {
			return nil, fmt.Errorf("cost limit %d exceeded", MaxConstraintCost)
		}
		return nil, err
	}
	return out, nil
}

// because is what a denial tells the caller about the constraint: its
// message, or else its expression.
func (c *Constraint) because() string {
	if c.Message != "" {
		return ": " + c.Message
	}
	return ": " + c.Expr
}

// activation hands CEL the call's variables without building a map per
// evaluation. They are pooled: CEL keeps no activation past Eval, and one
// made per evaluation would escape to the heap, in every Check as many
// times as it has constraints.
type activation struct{ in Input }

var activations = sync.Pool{New: func() any { return new(activation) }}

// noArgs stands in for nil Args: CEL then sees an empty map, never null.
var noArgs = map[string]any{}

func (a *activation) ResolveName(name string) (any, bool) {
	switch name {
	case "args":
		if a.in.Args == nil {
			return noArgs, true
		}
		return a.in.Args, true
	case "principal":
		return a.in.Principal, true
	case "server":
		return a.in.Server, true
	case "tool":
		return a.in.Tool, true
	}
	return nil, false
}

func (*activation) Parent() interpreter.Activation { return nil }
