package policy

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
)

// ChangeRule puts a server's tools, or one of them, under change control:
// a definition the server changes is not the new contract until the rule
// accepts the change or a person among Reviewers approves its diff. A
// server no rule names is not under change control: whatever it lists
// becomes what its callers are held to when they list again.
//
//	changes:
//	  - server: billing
//	    first_sight: approve        # or review: hold every tool of a new catalog
//	    accept: "change.kinds.all(k, k == 'title_changed')"
//	    reviewers: ["group:billing-oncall"]
//	    ttl: 72h                    # how long a review waits for a person
type ChangeRule struct {
	Server string `yaml:"server" json:"server"`
	// Tool, when set, narrows the rule to one tool; a tool's own rule wins
	// over its server's.
	Tool string `yaml:"tool,omitempty" json:"tool,omitempty"`
	// FirstSight says how a tool with no approved definition yet is
	// admitted: FirstSightApprove (the default) approves what the server
	// first lists, FirstSightReview holds it for a reviewer.
	FirstSight string `yaml:"first_sight,omitempty" json:"first_sight,omitempty"`
	// Accept is a CEL expression over the change that, when it holds,
	// approves it without a person: change.kinds and change.fields are
	// the kinds of change (tooldiff's names) and the fields they touch.
	// Empty accepts nothing.
	Accept string `yaml:"accept,omitempty" json:"accept,omitempty"`
	// Reviewers approve or reject every change Accept does not: an
	// identity exactly, or group:NAME.
	Reviewers []string `yaml:"reviewers" json:"reviewers"`
	// TTL is how long a review waits for a person: a duration from 1m to
	// 720h; empty means 72h.
	TTL string `yaml:"ttl,omitempty" json:"ttl,omitempty"`
}

// How a tool with no approved definition yet is admitted.
const (
	FirstSightApprove = "approve"
	FirstSightReview  = "review"
)

// DefaultReviewTTL is how long a review waits, unless its rule says.
const DefaultReviewTTL = 72 * time.Hour

// ChangeControl is a compiled ChangeRule: how changes to one tool are
// admitted.
type ChangeControl struct {
	// Rule names the rule, by its field, for the audit trail and the
	// reviewer: "changes[0]".
	Rule string
	// Review is set when a tool seen for the first time waits for a
	// reviewer.
	Review bool
	// Reviewers and TTL are the review's.
	Reviewers []string
	TTL       time.Duration

	accept     *cel.Program
	acceptExpr string
	written    ChangeRule
}

type changeKey struct{ server, tool string }

// changeEnv declares what an accept expression reads.
var changeEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(cel.Variable("change", cel.MapType(cel.StringType, cel.ListType(cel.StringType))))
})

func (p *Policy) compileChanges(rules []ChangeRule) (map[changeKey]*ChangeControl, error) {
	out := map[changeKey]*ChangeControl{}
	for i, r := range rules {
		field := fmt.Sprintf("changes[%d]", i)
		if r.Server == "" {
			return nil, fmt.Errorf("%s.server: required", field)
		}
		k := changeKey{r.Server, r.Tool}
		if k.tool == Wildcard {
			k.tool = ""
		}
		// A rule that governs no classified tool would never take effect:
		// almost always a typo.
		if k.tool != "" {
			if _, ok := p.tools[toolKey(k)]; !ok {
				return nil, fmt.Errorf("%s.tool: %s/%s is not classified under tools", field, k.server, k.tool)
			}
		} else if !slices.ContainsFunc(p.order, func(t toolKey) bool { return t.server == k.server }) {
			return nil, fmt.Errorf("%s.server: no tool of %s is classified under tools", field, k.server)
		}
		if prev, dup := out[k]; dup {
			return nil, fmt.Errorf("%s: %s is already under %s", field, changeTarget(k), prev.Rule)
		}
		c := &ChangeControl{Rule: field, TTL: DefaultReviewTTL, written: r}
		switch r.FirstSight {
		case "", FirstSightApprove:
		case FirstSightReview:
			c.Review = true
		default:
			return nil, fmt.Errorf("%s.first_sight: %q, want %q or %q", field, r.FirstSight, FirstSightApprove, FirstSightReview)
		}
		if len(r.Reviewers) == 0 {
			return nil, fmt.Errorf("%s.reviewers: at least one reviewer (an identity, or group:NAME) is required", field)
		}
		for j, who := range r.Reviewers {
			if strings.TrimSpace(who) == "" || who == "group:" {
				return nil, fmt.Errorf("%s.reviewers[%d]: empty", field, j)
			}
		}
		c.Reviewers = r.Reviewers
		if r.TTL != "" {
			d, err := time.ParseDuration(r.TTL)
			if err != nil || d < time.Minute || d > 720*time.Hour {
				return nil, fmt.Errorf("%s.ttl: %q is not a duration from 1m to 720h", field, r.TTL)
			}
			c.TTL = d
		}
		if r.Accept != "" {
			prog, err := compileAccept(r.Accept)
			if err != nil {
				return nil, fmt.Errorf("%s.accept: %w", field, err)
			}
			c.accept, c.acceptExpr = prog, r.Accept
		}
		out[k] = c
	}
	return out, nil
}

func compileAccept(src string) (*cel.Program, error) {
	env, err := changeEnv()
	if err != nil {
		return nil, fmt.Errorf("cel environment: %w", err)
	}
	checked, iss := env.Compile(src)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	if !checked.OutputType().IsExactType(cel.BoolType) {
		return nil, fmt.Errorf("%q is of type %s, want bool", src, checked.OutputType())
	}
	prog, err := env.Program(checked, cel.CostLimit(MaxConstraintCost))
	if err != nil {
		return nil, err
	}
	return &prog, nil
}

func changeTarget(k changeKey) string {
	if k.tool == "" {
		return "every tool of " + k.server
	}
	return k.server + "/" + k.tool
}

// UnderChangeControl reports whether any server's tools are under change
// control: capsnap must then serve reviews.
func (p *Policy) UnderChangeControl() bool { return len(p.changes) > 0 }

// ChangeControl is how changes to server/tool are admitted: the tool's
// own rule, else its server's, else nil (not under change control).
func (p *Policy) ChangeControl(server, tool string) *ChangeControl {
	if c, ok := p.changes[changeKey{server, tool}]; ok {
		return c
	}
	return p.changes[changeKey{server, ""}]
}

// Accepts reports whether the rule approves, without a person, a change
// of these kinds touching these fields. An expression that cannot be
// evaluated accepts nothing: the change waits for a reviewer.
func (c *ChangeControl) Accepts(kinds, fields []string) bool {
	if c.accept == nil {
		return false
	}
	out, _, err := (*c.accept).Eval(map[string]any{"change": map[string][]string{"kinds": kinds, "fields": fields}})
	return err == nil && out == types.True
}

// Describe says the rule in words, for the reviewer and the audit trail.
func (c *ChangeControl) Describe() string {
	s := c.Rule
	if c.acceptExpr != "" {
		s += " accepting " + c.acceptExpr
	}
	return s + ", reviewers " + strings.Join(c.Reviewers, ", ")
}

// looserChanges lists how next governs changes more loosely than old: a
// tool no longer under change control, a first sight no longer reviewed,
// another accept expression (which may accept more), or a reviewer old did
// not name.
func looserChanges(old, next *Policy) []string {
	var out []string
	for k, o := range old.changes {
		n := next.ChangeControl(k.server, k.tool)
		what := changeTarget(k)
		switch {
		case n == nil:
			out = append(out, fmt.Sprintf("%s: no longer under change control (was %s)", what, o.Rule))
			continue
		case o.Review && !n.Review:
			out = append(out, fmt.Sprintf("%s: a tool first seen is now approved without review", what))
		}
		if n.acceptExpr != o.acceptExpr && n.acceptExpr != "" {
			out = append(out, fmt.Sprintf("%s: changes accepted without review when %q, was %q", what, n.acceptExpr, o.acceptExpr))
		}
		for _, who := range n.Reviewers {
			if !slices.Contains(o.Reviewers, who) {
				out = append(out, fmt.Sprintf("%s: changes may now be approved by %s", what, who))
			}
		}
	}
	return out
}

// Granted lists, sorted, the principal rules that grant server/tool: who a
// reviewer of its change lets call it.
func (p *Policy) Granted(server, tool string) []string {
	var out []string
	for _, r := range p.rules() {
		if o := r.outcomes[toolKey{server, tool}]; o != nil && o.granted {
			out = append(out, r.name)
		}
	}
	return out
}
