package policy

import (
	"encoding/json"
	"time"
)

// A Term is one rule of the policy that a call must satisfy once its
// contract is the pinned one, as its Kind compiled it into every Decision
// it applies to (Decision.Terms): the decision core runs them in order and
// knows none of them.
type Term interface {
	// Check decides call: nil if the rule holds, or why not, as a
	// *deny.Error. Any other error is the store's (a term that spans
	// calls reads one), and fails the call closed.
	Check(call Call) error
	// Records reports whether Check records the call as it allows it (a
	// rule that spans calls). Such terms run last, once nothing else can
	// deny the call, so that a denied call is never recorded.
	Records() bool
}

// A Prechecker is a term that can also decide a call without the store:
// on its arguments and time alone (a constraint, a budget's amount). It
// is what policy explain and check can say before a call is made; a call
// with nil Args stands for one whose arguments are not known, and what
// reads them then passes.
type Prechecker interface {
	Term
	Precheck(call Call) error
}

// Call is what a Term decides: the call and who makes it where, the
// snapshot it is verified under, the calls allowed before it under that
// snapshot, and the counters of its budgets and rate limits.
type Call struct {
	Input
	// Now is when the call is decided: the clock reaches every kind
	// through the call it checks, so a test can set it.
	Now time.Time
	// Snapshot is the epoch of the snapshot the call is verified under.
	Snapshot string
	// Log holds the calls allowed under the snapshot.
	Log CallLog
	// Counters holds every principal's budgets and rate limits (the
	// snapshot store's, shared like it). A call under a budget or rate
	// limit without one fails closed.
	Counters Counters
	// Arguments are the call's arguments as sent, SchemaDigest, Effect and
	// PolicyDigest what it is pinned to, and Approvals the approvals
	// people gave: what an approval rule binds a person's approval to.
	Arguments                  json.RawMessage
	SchemaDigest, PolicyDigest string
	Effect                     EffectClass
	Approvals                  Approvals
}

// CallLog is all a term that spans calls reads and writes: the calls
// allowed under one snapshot, kept where the snapshot is (in process, or
// in the store replicas share), so that a call allowed on one replica
// counts on every other.
type CallLog interface {
	// Follows reports whether every tool in after has been called, and
	// allowed, under the snapshot. If so and record is set, it notes tool
	// as called, for the calls after it.
	Follows(tool string, after []string, record bool) (bool, error)
}
