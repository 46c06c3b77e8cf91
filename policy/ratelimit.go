package policy

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/deny"
)

// RateLimit is a named count of a principal's allowed calls in a window.
// On a tool rule it counts the principal's calls to that tool; on a grant,
// per tool (each tool the grant grants counted apart) or per principal
// (all of them together). A call is allowed only if the window holds fewer
// than Limit calls, and counts as it is allowed (Counters). In a File it
// is only text; Compile returns compiled ones.
type RateLimit struct {
	// Name is the rate limit's counter, named as a Budget's is.
	Name string `yaml:"name" json:"name"`
	// Limit is the most calls the window may hold: a whole number, but
	// decoded as any number is so that 1.5 is refused, not cut to 1.
	Limit float64 `yaml:"limit" json:"limit"`
	// Window is how far back it counts, as a Budget's.
	Window string `yaml:"window" json:"window"`
	// Per is what is counted apart: PerTool (the default; a tool rule's
	// only choice) or, on a grant, PerPrincipal.
	Per string `yaml:"per,omitempty" json:"per,omitempty"`

	c counter
}

// What a rate limit counts apart.
const (
	PerTool      = "tool"
	PerPrincipal = "principal"
)

var _ Reserver = (*RateLimit)(nil)

func init() { register(rateLimitKind{}) }

// rateLimitKind is rate_limits: counts of each principal's allowed calls
// in a window, on a tool rule and on a grant, the tool's first. They
// record, and can give back, so they run after every term that only
// reads the call.
type rateLimitKind struct{}

func (rateLimitKind) Key() string   { return "rate_limits" }
func (rateLimitKind) Stage() int    { return 20 }
func (rateLimitKind) OnGrant() bool { return true }

func (rateLimitKind) Compile(s *Site, value *yaml.Node) (Rules, error) {
	var rs []RateLimit
	if err := s.Decode("rate_limits", value, &rs); err != nil {
		return nil, err
	}
	var out rateLimits
	for i, r := range rs {
		cr, err := compileRateLimit(fmt.Sprintf("%s[%d]", s.At("rate_limits"), i), r, s.Grant, s.scope()...)
		if err != nil {
			return nil, err
		}
		if err := s.count(&cr.c); err != nil {
			return nil, err
		}
		out = append(out, cr)
	}
	return out, nil
}

func (rateLimitKind) Apply(tool, grant Rules) Applied {
	return rateLimits(slices.Concat(tool.(rateLimits), grant.(rateLimits)))
}

// rateLimits are a site's rate limits, or those that apply to a call.
type rateLimits []*RateLimit

// A rate limit's window is digested as counted, as a budget's.
type digestedRateLimit struct {
	Name   string  `json:"name"`
	Limit  float64 `json:"limit"`
	Window string  `json:"window"`
	Per    string  `json:"per"`
}

// Digested implements Rules: none leaves the key out.
func (rs rateLimits) Digested() any {
	if len(rs) == 0 {
		return nil
	}
	var out []digestedRateLimit
	for _, r := range rs {
		out = append(out, digestedRateLimit{Name: r.Name, Limit: r.Limit, Window: r.c.span.String(), Per: r.Per})
	}
	return out
}

// Reads implements Rules: a rate limit reads no argument.
func (rateLimits) Reads() []Reading { return nil }

func (rs rateLimits) spans() []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("rate limit %q: at most %s", r.Name, r.c.describe()))
	}
	return out
}

// Terms implements Applied.
func (rs rateLimits) Terms() []Term { return termsOf(rs) }

// Looser implements Applied: a rate limit removed or renamed, its limit
// raised, its window shortened, or counted per tool where it counted per
// principal.
func (rs rateLimits) Looser(next Applied) []string {
	return looserLimits(rs, next.(rateLimits), (*RateLimit).counts, func(o, n *RateLimit) []string {
		if n.c.perTool && !o.c.perTool {
			return []string{fmt.Sprintf("rate limit %q now counts each tool apart, not all together", o.Name)}
		}
		return nil
	})
}

// Explain implements Applied: whether the window has room is the
// counter's to say.
func (rs rateLimits) Explain(Call) Explanation {
	if len(rs) == 0 {
		return Explanation{Lines: []string{"no rate limits"}}
	}
	e := Explanation{Unless: "its rate limits have room", Otherwise: []deny.Reason{deny.RateLimited}}
	for _, r := range rs {
		e.Lines = append(e.Lines, fmt.Sprintf("rate limit %q (%s): at most %s", r.Name, r.c.field, r.c.describe()))
	}
	return e
}

// compileRateLimit compiles r, declared on a grant if onGrant, else on a
// tool rule.
func compileRateLimit(field string, r RateLimit, onGrant bool, scope ...string) (*RateLimit, error) {
	if strings.TrimSpace(r.Name) == "" {
		return nil, fmt.Errorf("%s.name: required", field)
	}
	switch {
	case r.Per == "":
		r.Per = PerTool
	case r.Per == PerPrincipal && !onGrant:
		return nil, fmt.Errorf("%s.per: %q is for a grant's rate limit; a tool rule's counts its own tool", field, r.Per)
	case r.Per != PerTool && r.Per != PerPrincipal:
		return nil, fmt.Errorf("%s.per: %q, want %q or %q", field, r.Per, PerTool, PerPrincipal)
	}
	if r.Limit != math.Trunc(r.Limit) {
		return nil, fmt.Errorf("%s.limit: %v is not a whole number of calls", field, r.Limit)
	}
	limit := int64(-1) // newCounter says what a limit must be
	if r.Limit > 0 && r.Limit <= maxUnits/Units {
		limit = int64(r.Limit) * Units
	}
	c, err := newCounter(KindRateLimit, field, r.Name, limit, r.Window, scope...)
	if err != nil {
		return nil, err
	}
	c.perTool = onGrant && r.Per == PerTool
	r.c = c
	return &r, nil
}

func (r *RateLimit) counts() *counter { return &r.c }

// Names implements Counted.
func (r *RateLimit) Names() (name, field string) { return r.Name, r.c.field }

// Taken implements Counted: calls, a whole number of them.
func (r *RateLimit) Taken(call Call, calls float64) (Charge, bool) {
	if calls != math.Trunc(calls) || calls < 0 || calls > maxUnits/Units {
		return Charge{}, false
	}
	return r.c.taken(call, int64(calls)*Units)
}

// Check implements Term: Reserve, the reservation dropped.
func (r *RateLimit) Check(call Call) error {
	_, err := r.Reserve(call)
	return err
}

// Records implements Term: an allowed call counts.
func (*RateLimit) Records() bool { return true }

// Reserve implements Reserver: one call, counted in the principal's counter
// if the window has room, else denied deny.RateLimited with when it will.
func (r *RateLimit) Reserve(call Call) (Reservation, error) {
	return r.c.reserve(call, Units, deny.RateLimited)
}
