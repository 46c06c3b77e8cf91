package policy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/deny"
)

// ApprovalRule holds a tool's calls for a person's approval of their exact
// arguments: when When holds (always, if empty), a call is allowed only
// once a person among Approvers has approved that very call, and only once.
// In a File it is only text; Compile returns compiled ones.
type ApprovalRule struct {
	// Name, when set, names the rule where people read it (the approver's
	// page, the webhook, denials), so that it does not move when the
	// policy is reordered, as its position (tools[3].approval) does.
	Name string `yaml:"name,omitempty" json:"name,omitempty"`
	// When is a CEL expression over the call, as a constraint's, that
	// says whether the call needs approval, e.g. args.amount > 100.
	When string `yaml:"when,omitempty" json:"when,omitempty"`
	// Approvers are who may approve: an identity exactly, or group:NAME
	// for everyone whose verified token names the group.
	Approvers []string `yaml:"approvers" json:"approvers"`
	// TTL is how long an approval may wait to be used once given: a
	// duration from 1m to 24h; empty means 15m.
	TTL string `yaml:"ttl,omitempty" json:"ttl,omitempty"`
	// SelfApprove lets the requesting principal approve its own call;
	// never by default.
	SelfApprove bool `yaml:"self_approve,omitempty" json:"self_approve,omitempty"`

	field string
	when  *expression
	ttl   time.Duration
}

// DefaultApprovalTTL is an approval's life once given, unless the rule
// says otherwise.
const DefaultApprovalTTL = 15 * time.Minute

var _ Prechecker = (*ApprovalRule)(nil)

func init() { register(approvalKind{}) }

// approvalKind is a tool rule's approval: the call waits for a person. It
// is used as the call is allowed and cannot be given back, so it runs
// last, once nothing else can deny the call.
type approvalKind struct{}

func (approvalKind) Key() string   { return "approval" }
func (approvalKind) Stage() int    { return 50 }
func (approvalKind) OnGrant() bool { return false }

func (approvalKind) Compile(s *Site, value *yaml.Node) (Rules, error) {
	var a *ApprovalRule
	if err := s.Decode("approval", value, &a); err != nil {
		return nil, err
	}
	c, err := compileApproval(s.At("approval"), a)
	return approvalRules{c}, err
}

func (approvalKind) Apply(tool, _ Rules) Applied { return tool.(approvalRules) }

// approvalRules are a tool rule's approval rule, nil when it has none.
type approvalRules struct{ a *ApprovalRule }

type digestedApproval struct {
	Name        string   `json:"name,omitempty"`
	When        string   `json:"when"`
	Approvers   []string `json:"approvers"`
	TTL         string   `json:"ttl"`
	SelfApprove bool     `json:"self_approve"`
}

// Digested implements Rules: none leaves the key out.
func (r approvalRules) Digested() any {
	if r.a == nil {
		return nil
	}
	return digestedApproval{Name: r.a.Name, When: r.a.When, Approvers: slices.Sorted(slices.Values(r.a.Approvers)), TTL: r.a.ttl.String(), SelfApprove: r.a.SelfApprove}
}

// Reads implements Rules: its when.
func (r approvalRules) Reads() []Reading {
	if r.a == nil || r.a.when == nil {
		return nil
	}
	return []Reading{{Field: r.a.field + ".when", expr: r.a.when, Guard: "guard it with has(args.%[1]s)"}}
}

func (r approvalRules) spans() []string {
	if r.a == nil {
		return nil
	}
	return []string{"approval: " + r.a.describe()}
}

// Terms implements Applied.
func (r approvalRules) Terms() []Term {
	if r.a == nil {
		return nil
	}
	return []Term{r.a}
}

// Looser implements Applied: calls held for approval not at all, on
// another condition (which may hold less often), approved by people old
// did not name, or by the caller itself, or an approval that lives
// longer.
func (r approvalRules) Looser(next Applied) []string {
	old, n := r.a, next.(approvalRules).a
	switch {
	case old == nil:
		return nil
	case n == nil:
		return []string{fmt.Sprintf("approval (%s) removed", old.describe())}
	}
	var out []string
	if n.When != old.When {
		out = append(out, fmt.Sprintf("approval needed when %q, was %q", n.When, old.When))
	}
	for _, who := range n.Approvers {
		if !slices.Contains(old.Approvers, who) {
			out = append(out, fmt.Sprintf("approval may now be given by %s", who))
		}
	}
	if n.SelfApprove && !old.SelfApprove {
		out = append(out, "approval may now be given by the caller itself")
	}
	if n.ttl > old.ttl {
		out = append(out, fmt.Sprintf("an approval now lives %s, was %s", n.ttl, old.ttl))
	}
	return out
}

// Explain implements Applied: whether the call waits for a person.
func (r approvalRules) Explain(call Call) Explanation {
	a := r.a
	if a == nil {
		return Explanation{Lines: []string{"no approval rule"}}
	}
	line := fmt.Sprintf("approval (%s): ", a.describe())
	// A principal that opened too many requests is refused a new one:
	// rate_limited, as the approval service bounds them.
	held := []deny.Reason{deny.ApprovalRequired, deny.ApprovalDenied, deny.RateLimited}
	waits := Explanation{Lines: []string{line + "this call waits for a person's approval of its exact arguments"}, Unless: "a person approves it", Otherwise: held}
	switch {
	case a.when == nil:
		return waits
	case call.Args == nil:
		return Explanation{Lines: []string{line + "not evaluated, no arguments given"}, Unless: "a person approves it when " + a.When,
			Otherwise: append([]deny.Reason{deny.ConstraintViolation}, held...)}
	}
	v, err := a.when.eval(call.Input)
	switch {
	case err != nil:
		return Explanation{Lines: []string{fmt.Sprintf("%sits when could not be evaluated (%v), which DENIES THE CALL", line, err)}, Denials: []Denial{{a.field, deny.ConstraintViolation}}}
	case v != types.True:
		return Explanation{Lines: []string{line + "this call needs no approval"}}
	}
	return waits
}

// HoldsForApproval reports whether any tool rule holds calls for a
// person's approval: capsnap must then serve approvals.
func (p *Policy) HoldsForApproval() bool {
	i := kindIndex(approvalKind{}.Key())
	for _, t := range p.tools {
		if t.rules[i].(approvalRules).a != nil {
			return true
		}
	}
	return false
}

func compileApproval(field string, a *ApprovalRule) (*ApprovalRule, error) {
	if a == nil {
		return nil, nil
	}
	c := *a
	c.field = field
	if c.Name != "" && strings.TrimSpace(c.Name) != c.Name {
		return nil, fmt.Errorf("%s.name: %q has space around it", field, c.Name)
	}
	if len(c.Approvers) == 0 {
		return nil, fmt.Errorf("%s.approvers: at least one approver (an identity, or group:NAME) is required", field)
	}
	for i, who := range c.Approvers {
		if strings.TrimSpace(who) == "" || who == "group:" {
			return nil, fmt.Errorf("%s.approvers[%d]: empty", field, i)
		}
	}
	c.ttl = DefaultApprovalTTL
	if c.TTL != "" {
		d, err := time.ParseDuration(c.TTL)
		if err != nil || d < time.Minute || d > 24*time.Hour {
			return nil, fmt.Errorf("%s.ttl: %q is not a duration from 1m to 24h", field, c.TTL)
		}
		c.ttl = d
	}
	if c.When != "" {
		when, err := compileExpression(c.When, func(t *cel.Type) error {
			if t.IsExactType(cel.BoolType) || t.IsExactType(cel.DynType) {
				return nil
			}
			return fmt.Errorf("%q is of type %s, want a bool", c.When, t)
		})
		if err != nil {
			return nil, fmt.Errorf("%s.when: %w", field, err)
		}
		c.when = when
	}
	return &c, nil
}

// Approvals is what an approval rule reads and writes: the approvals
// people gave, kept where every replica sees them, each for exactly one
// call, used once.
type Approvals interface {
	// Consume uses the approval a person gave for exactly a's call, if
	// one is waiting: ok reports whether there was one.
	Consume(a Approval) (ok bool, err error)
	// Ask opens the request for a's call, or finds the one still open,
	// and says where a person approves it.
	Ask(a Approval) (*deny.ApprovalInfo, error)
}

// Approval is one call an approval rule holds, as the approvals store
// binds it: who calls which tool, as pinned, with which arguments, and
// what the rule asks.
type Approval struct {
	Principal, Server, Tool    string
	SchemaDigest, PolicyDigest string
	Effect                     EffectClass
	// Arguments are the call's arguments as sent.
	Arguments   json.RawMessage
	Approvers   []string
	SelfApprove bool
	TTL         time.Duration
	// Rule says, in words, which rule of the policy asked.
	Rule string
}

// Check implements Term: a call the rule holds is allowed only by using a
// person's approval of it; without one, a request is opened (or the open
// one found) and the call denied approval_required with where to approve.
func (a *ApprovalRule) Check(call Call) error {
	if a.when != nil {
		v, err := a.when.eval(call.Input)
		if err != nil {
			return deny.Errorf(deny.ConstraintViolation, "approval rule %s: when %s could not be evaluated on the call's arguments (%v)", a.field, a.When, err)
		}
		if v != types.True {
			return nil
		}
	}
	if call.Approvals == nil {
		return fmt.Errorf("approval rule %s: no approvals store: a call held for approval cannot be approved", a.field)
	}
	ask := Approval{
		Principal: call.Principal, Server: call.Server, Tool: call.Tool,
		SchemaDigest: call.SchemaDigest, PolicyDigest: call.PolicyDigest, Effect: call.Effect,
		Arguments: call.Arguments, Approvers: a.Approvers, SelfApprove: a.SelfApprove, TTL: a.ttl,
		Rule: a.describe(),
	}
	ok, err := call.Approvals.Consume(ask)
	if err != nil || ok {
		return err
	}
	info, err := call.Approvals.Ask(ask)
	if err != nil {
		return err
	}
	return &deny.Error{Reason: deny.ApprovalRequired, Approval: info,
		Detail: fmt.Sprintf("%s/%s with these exact arguments needs a person's approval (%s): approve it at %s, then send the identical call again", call.Server, call.Tool, a.describe(), info.URL)}
}

// Precheck implements Prechecker: a call whose when cannot be evaluated
// is denied, as Check denies it; whether a person approves is not known
// before the call.
func (a *ApprovalRule) Precheck(call Call) error {
	if a.when == nil || call.Args == nil {
		return nil
	}
	if _, err := a.when.eval(call.Input); err != nil {
		return deny.Errorf(deny.ConstraintViolation, "approval rule %s: when %s could not be evaluated on the call's arguments (%v)", a.field, a.When, err)
	}
	return nil
}

// Records implements Term: the approval is used as the call is allowed,
// so it runs with the terms that record, after every other.
func (*ApprovalRule) Records() bool { return true }

// describe says the rule in words, for the approver and the detail.
func (a *ApprovalRule) describe() string {
	s := a.field
	if a.Name != "" {
		s = fmt.Sprintf("%q (%s)", a.Name, a.field)
	}
	if a.When != "" {
		s += " when " + a.When
	}
	return s + ", approvers " + strings.Join(a.Approvers, ", ")
}
