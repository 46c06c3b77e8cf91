// The counters of the budgets and rate limits as an operator reads and
// resets them (capsnap budgets, through the admin listener), under the
// policy in force.

package decide

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// Counter is one budget's or rate limit's counter of a principal's calls
// (and, counted per tool, of one tool's), as the store holds it now.
type Counter struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Rule is where the policy declares it, like tools[1].budgets[0].
	Rule string `json:"rule"`
	// Used and Limit are in the budget's units, or calls.
	Used   float64 `json:"used"`
	Limit  float64 `json:"limit"`
	Window string  `json:"window"`
	// FreesAt is when the oldest of what it holds stops counting, and
	// ResetsAt when all of it has; absent when it holds nothing.
	FreesAt  time.Time `json:"frees_at,omitzero"`
	ResetsAt time.Time `json:"resets_at,omitzero"`
}

// Errors of Counters and ResetCounter, besides the store's.
var (
	ErrNoCounter        = errors.New("no such counter")
	ErrAmbiguousCounter = errors.New("more than one counter")
)

// Counters are the counters of the budgets and rate limits that count
// principal's calls of tool on server under the policy in force, in the
// order a call is charged; rule, if set, keeps those it names: a name, or
// where the policy declares it.
func (s *Server) Counters(principal, server, tool, rule string) ([]Counter, error) {
	counted, err := s.counted(principal, server, tool, rule)
	if err != nil {
		return nil, err
	}
	out := make([]Counter, 0, len(counted))
	for _, c := range counted {
		n, err := s.snapshots.Count(c.charge.Counter, c.charge.Window, c.charge.Slot)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", c.kind, c.name, err)
		}
		out = append(out, counter(c, n))
	}
	return out, nil
}

// ResetCounter empties the one counter rule names of principal's calls of
// tool on server (a name, or where the policy declares it when two share
// the name), and returns what it held: the principal has the whole window
// again. It is audited with who asked and why, and counted.
func (s *Server) ResetCounter(principal, server, tool, rule string, by Signoff) (Counter, error) {
	if err := by.Check(); err != nil {
		return Counter{}, err
	}
	if rule == "" {
		return Counter{}, fmt.Errorf("%w: a reset names its budget or rate limit", ErrNoCounter)
	}
	counted, err := s.counted(principal, server, tool, rule)
	switch {
	case err != nil:
		return Counter{}, err
	case len(counted) > 1:
		var fields []string
		for _, c := range counted {
			fields = append(fields, c.field)
		}
		return Counter{}, fmt.Errorf("%w: %q names %s; give one of them instead", ErrAmbiguousCounter, rule, strings.Join(fields, " and "))
	}
	c := counted[0]
	n, err := s.snapshots.ResetCounter(c.charge.Counter, c.charge.Window, c.charge.Slot)
	if err != nil {
		return Counter{}, fmt.Errorf("%s %q: %w", c.kind, c.name, err)
	}
	held := counter(c, n)
	s.metrics.counterReset(c.kind, c.name)
	s.auditLog.Log().Str("event", "counter_reset").Str("kind", c.kind).Str("name", c.name).Str("rule", c.field).
		Str("principal", principal).Str("server_id", server).Str("tool", tool).
		Float64("used", held.Used).Float64("limit", held.Limit).Str("window", held.Window).
		Str("by", by.By).Str("reason", by.Reason).Msg("counter")
	return held, nil
}

// counted is one budget's or rate limit's counter of a call.
type counted struct {
	kind, name, field string
	// limit and window are as the policy writes them; charge names the
	// counter, and the window and slot it counts in.
	limit  float64
	window string
	charge policy.Charge
}

// counted are the counters of the call under the policy in force that
// rule keeps (all, if it is ""): the one declared where rule says, or
// those of its name; in the order a call is charged.
func (s *Server) counted(principal, server, tool, rule string) ([]counted, error) {
	d, err := s.rules.Load().Policy.Decide(principal, server, tool)
	if err != nil {
		return nil, fmt.Errorf("%w: the policy in force does not grant %s/%s to %s: %w", ErrNoCounter, server, tool, principal, err)
	}
	call := policy.Call{Input: policy.Input{Principal: principal, Server: server, Tool: tool}}
	var all []counted
	for _, t := range d.Terms {
		var c counted
		switch r := t.(type) {
		case *policy.Budget:
			c = counted{kind: policy.KindBudget, limit: r.Limit, window: r.Window}
		case *policy.RateLimit:
			c = counted{kind: policy.KindRateLimit, limit: r.Limit, window: r.Window}
		default:
			continue
		}
		k := t.(policy.Counted)
		c.name, c.field = k.Names()
		// Nothing taken: the charge only names the counter.
		c.charge, _ = k.Taken(call, 0)
		all = append(all, c)
	}
	if rule == "" {
		return all, nil
	}
	if i := slices.IndexFunc(all, func(c counted) bool { return c.field == rule }); i >= 0 {
		return all[i : i+1], nil
	}
	named := slices.DeleteFunc(all, func(c counted) bool { return c.name != rule })
	if len(named) == 0 {
		return nil, fmt.Errorf("%w: no budget or rate limit %q counts %s's calls of %s/%s", ErrNoCounter, rule, principal, server, tool)
	}
	return named, nil
}

// counter is c as an operator reads it, holding n.
func counter(c counted, n store.Count) Counter {
	return Counter{
		Kind: c.kind, Name: c.name, Rule: c.field,
		Used: float64(n.Used) / policy.Units, Limit: c.limit, Window: c.window,
		FreesAt: n.FreesAt.UTC(), ResetsAt: n.ResetsAt.UTC(),
	}
}
