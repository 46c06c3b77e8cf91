package policy

import (
	"fmt"
	"strings"

	"github.com/capsnap/capsnap/deny"
)

// sequence is a tool rule's after: the tool may be called only once every
// tool of after has been called, and allowed, under the same snapshot. It
// also records the allowed calls of a tool another rule's after names
// (precedes), and of no other tool, so that the log holds only what some
// rule reads.
type sequence struct {
	after    []string
	precedes bool
}

var _ Term = sequence{}

// sequenceOf is the sequence term of a tool, or nil when no rule orders
// it: a call to it then reads and records nothing.
func sequenceOf(t *tool) Term {
	if len(t.after) == 0 && !t.precedes {
		return nil
	}
	return sequence{after: t.after, precedes: t.precedes}
}

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
