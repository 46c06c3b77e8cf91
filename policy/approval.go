package policy

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"

	"github.com/capsnap/capsnap/deny"
)

// ApprovalRule holds a tool's calls for a person's approval of their exact
// arguments: when When holds (always, if empty), a call is allowed only
// once a person among Approvers has approved that very call, and only once.
// In a File it is only text; Compile returns compiled ones.
type ApprovalRule struct {
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

var _ Term = (*ApprovalRule)(nil)

func compileApproval(field string, a *ApprovalRule) (*ApprovalRule, error) {
	if a == nil {
		return nil, nil
	}
	c := *a
	c.field = field
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

// Records implements Term: the approval is used as the call is allowed,
// so it runs with the terms that record, after every other.
func (*ApprovalRule) Records() bool { return true }

// describe says the rule in words, for the approver and the detail.
func (a *ApprovalRule) describe() string {
	s := a.field
	if a.When != "" {
		s += " when " + a.When
	}
	return s + ", approvers " + strings.Join(a.Approvers, ", ")
}
