package policy

import (
	"fmt"
	"math"
	"strings"

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
