package policy

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/deny"
)

func init() { register(sequenceKind{}) }

// sequenceKind is a tool rule's after: tools of the same server that must
// have been called, and allowed, earlier under the same snapshot. It
// records the calls it reads, and can give nothing back, so it runs after
// every term that can.
type sequenceKind struct{}

func (sequenceKind) Key() string   { return "after" }
func (sequenceKind) Stage() int    { return 40 }
func (sequenceKind) OnGrant() bool { return false }

func (sequenceKind) Compile(s *Site, value *yaml.Node) (Rules, error) {
	var after []string
	if err := s.Decode("after", value, &after); err != nil {
		return nil, err
	}
	for j, a := range after {
		if a == "" {
			return nil, fmt.Errorf("%s[%d]: empty tool name", s.At("after"), j)
		}
	}
	return &sequenceRules{field: s.At("after"), written: after, after: []string{}}, nil
}

func (sequenceKind) Apply(tool, _ Rules) Applied { return tool.(*sequenceRules) }

var (
	_ linker  = sequenceKind{}
	_ needing = (*sequenceRules)(nil)
)

// link checks that every after names a classified tool of the same
// server, marks the tools that are named (their calls are recorded), and
// refuses a cycle.
func (sequenceKind) link(p *Policy, i int) error {
	for _, k := range p.order {
		r := p.tools[k].rules[i].(*sequenceRules)
		for j, a := range r.written {
			target, ok := p.tools[toolKey{k.server, a}]
			if !ok {
				return fmt.Errorf("%s[%d]: %s/%s is not classified under tools (after names tools of the same server)", r.field, j, k.server, a)
			}
			if !slices.Contains(r.after, a) {
				r.after = append(r.after, a)
			}
			target.rules[i].(*sequenceRules).precedes = true
		}
		slices.Sort(r.after)
	}
	return checkAfterCycles(p, i)
}

// checkAfterCycles refuses a sequence rule that no call could ever satisfy:
// a tool that must follow itself, directly or through others.
func checkAfterCycles(p *Policy, i int) error {
	const (
		unvisited = iota
		visiting
		done
	)
	after := func(k toolKey) []string { return p.tools[k].rules[i].(*sequenceRules).after }
	state := map[toolKey]int{}
	var path []string
	var visit func(k toolKey) []string
	visit = func(k toolKey) []string {
		state[k] = visiting
		path = append(path, k.tool)
		for _, a := range after(k) {
			next := toolKey{k.server, a}
			switch state[next] {
			case visiting:
				start := slices.Index(path, a)
				return append(slices.Clone(path[start:]), a)
			case unvisited:
				if cycle := visit(next); cycle != nil {
					return cycle
				}
			}
		}
		path = path[:len(path)-1]
		state[k] = done
		return nil
	}
	// In file order, so that the same file always reports the same cycle.
	for _, k := range p.order {
		if state[k] != unvisited {
			continue
		}
		path = path[:0]
		if cycle := visit(k); cycle != nil {
			return fmt.Errorf("%s: %s: %s is a cycle, so no call could satisfy it", p.tools[k].rules[i].(*sequenceRules).field, k.server, strings.Join(cycle, " → "))
		}
	}
	return nil
}

// sequenceRules are a tool rule's after, linked.
type sequenceRules struct {
	field   string
	written []string
	// after is written sorted and distinct (never nil, so that a digest
	// spells "none" one way).
	after []string
	// precedes is set when another tool's after names this one.
	precedes bool
}

// Digested implements Rules.
func (r *sequenceRules) Digested() any { return r.after }

// Reads implements Rules: it reads no argument.
func (*sequenceRules) Reads() []Reading { return nil }

// Terms implements Applied: none for a tool no rule orders, whose calls
// then read and record nothing.
func (r *sequenceRules) Terms() []Term {
	if len(r.after) == 0 && !r.precedes {
		return nil
	}
	return []Term{sequence{after: r.after, precedes: r.precedes}}
}

// Looser implements Applied: a requirement dropped.
func (r *sequenceRules) Looser(next Applied) []string {
	var out []string
	for _, a := range r.after {
		if !slices.Contains(next.(*sequenceRules).after, a) {
			out = append(out, fmt.Sprintf("no longer requires %s first", a))
		}
	}
	return out
}

// Explain implements Applied.
func (r *sequenceRules) Explain(Call) Explanation {
	if len(r.after) == 0 {
		return Explanation{Lines: []string{"no sequence rule"}}
	}
	return Explanation{
		Lines:     []string{fmt.Sprintf("after: only once %s has been called, and allowed, under the same snapshot", strings.Join(r.after, ", "))},
		Unless:    "the sequence rule is met",
		Otherwise: []deny.Reason{deny.SequenceViolation},
	}
}

// needs implements needing: the tools that must be called first.
func (r *sequenceRules) needs() []string { return r.after }

// sequence is the term of a tool rule's after: the tool may be called
// only once every tool of after has been called, and allowed, under the
// same snapshot. It also records the allowed calls of a tool another
// rule's after names (precedes), and of no other tool, so that the log
// holds only what some rule reads.
type sequence struct {
	after    []string
	precedes bool
}

var _ Term = sequence{}

// Check implements Term.
func (s sequence) Check(call Call) error {
	ok, err := call.Log.Follows(call.Tool, s.after, s.precedes)
	if err != nil {
		return fmt.Errorf("sequence of %s: %w", call.Tool, err)
	}
	if !ok {
		return deny.Errorf(deny.SequenceViolation, "%s may be called only after %s under the same snapshot (%s)", call.Tool, strings.Join(s.after, " and "), call.Snapshot)
	}
	return nil
}

// Records implements Term: an allowed call is recorded.
func (sequence) Records() bool { return true }
