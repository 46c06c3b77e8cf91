// Package approval lets a person approve one exact tool call before capsnap
// allows it: the principal, server, tool, pinned schema digest, policy
// digest and the canonical digest of the arguments, once, before it
// expires.
//
// A call the policy holds for approval opens a Request (Service.Open),
// which waits in a Store that every replica shares; a person named by the
// policy's rule approves or denies it on the approval page or through the
// JSON API (NewHandler), authenticated by a token (Authenticator); and the
// identical call, retried, consumes the approval (Service.Consume), on any
// replica, exactly once. Any other arguments, tool definition or policy is
// another Binding and needs another approval. docs/APPROVALS.md tells the
// whole story.
package approval

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/capsnap/capsnap/envelope"
)

// Binding is what an approval is for: exactly one call, as the decision
// core verified it. Every field takes part; a call that differs in any one
// of them is not the approved call.
type Binding struct {
	Principal    string `json:"principal"`
	Server       string `json:"server"`
	Tool         string `json:"tool"`
	SchemaDigest string `json:"schema_digest"`
	PolicyDigest string `json:"policy_digest"`
	// ArgsDigest is ArgsDigest of the call's arguments.
	ArgsDigest string `json:"args_digest"`
}

// Key names the binding: the hex SHA-256 over its fields, each
// length-prefixed, in their order above. Two bindings have the same key
// exactly when every field is equal; stores index by it.
func (b Binding) Key() string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, f := range []string{b.Principal, b.Server, b.Tool, b.SchemaDigest, b.PolicyDigest, b.ArgsDigest} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(f)))])
		h.Write([]byte(f))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (b Binding) complete() bool {
	return b.Principal != "" && b.Server != "" && b.Tool != "" && b.SchemaDigest != "" && b.PolicyDigest != "" && b.ArgsDigest != ""
}

// ArgsDigest is the digest a Binding binds a call's arguments by:
// "sha256:<hex>" of their RFC 8785 (JCS) canonical form, "{}" for none.
// It is the envelope's (envelope.ArgsDigest), so one call has one digest
// wherever capsnap names it.
func ArgsDigest(args json.RawMessage) (string, error) {
	d, err := envelope.ArgsDigest(args)
	if err != nil {
		return "", fmt.Errorf("approval: %w", err)
	}
	return d, nil
}

// State is where a Request stands.
type State string

const (
	// Pending: waiting for a person.
	Pending State = "pending"
	// Approved: the identical call may run once, until Expires.
	Approved State = "approved"
	// Denied: a person refused it.
	Denied State = "denied"
	// Consumed: the approved call ran.
	Consumed State = "consumed"
	// Expired: no one decided before Expires, or the approved call did not
	// come again before it.
	Expired State = "expired"
)

func (s State) valid() bool {
	switch s {
	case Pending, Approved, Denied, Consumed, Expired:
		return true
	}
	return false
}

// Request is one call waiting for, or holding, a person's decision.
type Request struct {
	// ID names the request in its URL: 128 random bits (NewID).
	ID      string  `json:"id"`
	Binding Binding `json:"binding"`
	// Arguments are the call's arguments as the agent sent them, shown to
	// the approver; the Binding's ArgsDigest is what binds them.
	Arguments json.RawMessage `json:"arguments"`
	// EffectClass is the tool's pinned effect class (read, write,
	// money_move, admin).
	EffectClass string `json:"effect_class"`
	// Rule says, in words, which policy rule asked for approval.
	Rule string `json:"rule"`
	// Approvers may decide the request: "group:NAME" names everyone whose
	// token carries group NAME; any other entry is an approver identity,
	// matched exactly.
	Approvers []string `json:"approvers"`
	// SelfApprove lets an approver whose identity is the requesting
	// principal approve the call; off, it may only deny it.
	SelfApprove bool `json:"self_approve"`
	// ApprovalTTL is how long an approval lives once granted: approving
	// sets Expires to the moment of approval plus ApprovalTTL. It comes
	// from the policy's rule with the request, so an approval can never
	// outlive what the rule that asked for it allows.
	ApprovalTTL time.Duration `json:"approval_ttl"`
	Created     time.Time     `json:"created_at"`
	// Expires is when a pending request lapses undecided, and, once
	// approved, when the approval lapses unused.
	Expires time.Time `json:"expires_at"`
	State   State     `json:"state"`
	// DecidedBy is the approver's identity, from its verified token.
	DecidedBy string    `json:"decided_by,omitempty"`
	DecidedAt time.Time `json:"decided_at,omitzero"`
	// Reason is what the approver said, if anything.
	Reason string `json:"reason,omitempty"`
	// DeniedFor is how long a denial of a held call stands: the identical
	// call gets the denial, with its reason, not a new request, until
	// DecidedAt plus DeniedFor. The service sets it from its Config.
	DeniedFor time.Duration `json:"denied_for,omitempty"`
	// Change, set on a review of a changed tool definition rather than a
	// held call, is what changed: its Binding binds the tool at the new
	// digest (Principal ChangeReviewer, PolicyDigest the approved digest
	// or "none", ArgsDigest "change").
	Change *Change `json:"change,omitempty"`
}

// ChangeReviewer stands in a change review's Binding where a call's would
// name its principal: no agent asks, capsnap does.
const ChangeReviewer = "capsnap:change-control"

// Change is what a reviewer of a changed tool definition is shown.
type Change struct {
	// From is the approved digest, "" for a tool seen the first time; To
	// the digest under review.
	From string `json:"from,omitempty"`
	To   string `json:"to"`
	// Diff is the change, as tooldiff.Diff marshals it.
	Diff json.RawMessage `json:"diff"`
	// Definition is the definition under review (its canonical governing
	// members), cut to MaxChangeDefinition bytes.
	Definition string `json:"definition"`
	// Granted are the principal rules that grant the tool.
	Granted []string `json:"granted,omitempty"`
	// Wait is how long the review waits for a person, which Open uses in
	// place of the service's PendingTTL.
	Wait time.Duration `json:"wait"`
}

// MaxChangeDefinition bounds the definition a review shows and keeps: a
// server cannot fill the store, or the reviewer's page, through one tool.
const MaxChangeDefinition = 64 << 10

// The errors a Store's operations return for a request they will not
// change; any other error is the store failing to answer, on which every
// caller must deny.
var (
	ErrNotFound     = errors.New("approval: no such request")
	ErrExpired      = errors.New("approval: the request has expired")
	ErrDecided      = errors.New("approval: the request is already decided")
	ErrNotApprover  = errors.New("approval: not an approver of this request")
	ErrSelfApproval = errors.New("approval: the requesting principal may not approve its own call")
)

// idBytes is the randomness of an ID: 128 bits.
const idBytes = 16

// NewID returns a new request ID: 128 bits from crypto/rand, URL-safe
// base64 without padding (22 characters).
//
// An id never starts with '-': an approver pastes it into a command line
// (capsnap approvals approve ID), where it would read as a flag. Drawing
// again then costs a sixty-fourth of the ids, under 0.03 of a bit.
func NewID() string {
	var b [idBytes]byte
	for {
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
		if id := base64.RawURLEncoding.EncodeToString(b[:]); id[0] != '-' {
			return id
		}
	}
}

// ValidID reports whether id has the form NewID makes, so that a forged
// one is refused before any store is asked.
func ValidID(id string) bool {
	b, err := base64.RawURLEncoding.Strict().DecodeString(id)
	return err == nil && len(b) == idBytes && id[0] != '-'
}

// Approver is a person as their verified token names them.
type Approver struct {
	ID     string   `json:"id"`
	Groups []string `json:"groups,omitempty"`
}

// May reports whether a is one of r's approvers.
func (a Approver) May(r Request) bool {
	if a.ID == "" {
		return false
	}
	for _, e := range r.Approvers {
		if g, ok := strings.CutPrefix(e, "group:"); ok {
			if g != "" && slices.Contains(a.Groups, g) {
				return true
			}
		} else if e == a.ID {
			return true
		}
	}
	return false
}

// live reports whether r can still be decided or consumed at now.
func (r Request) live(now time.Time) bool {
	return (r.State == Pending || r.State == Approved) && now.Before(r.Expires)
}

// Holds reports whether a request opened for r's binding at now gets r
// instead: r is pending or approved, unexpired; or r was denied, and its
// denial stands: a held call's for DeniedFor after the decision (an agent
// that retries learns "no", with the reason, and pages no one), a review
// of a change's as long as the store keeps it (a server that keeps listing
// the rejected definition must not open a review per listing).
func (r Request) Holds(now time.Time) bool {
	if r.State == Denied {
		return r.Change != nil || now.Before(r.DecidedAt.Add(r.DeniedFor))
	}
	return r.live(now)
}

// At is r as it stands at now: a pending or approved request past its
// Expires is expired, whether or not a sweep has marked it yet.
func (r Request) At(now time.Time) Request {
	if (r.State == Pending || r.State == Approved) && !now.Before(r.Expires) {
		r.State = Expired
	}
	return r
}

// Decide returns r decided by by at now, or why it cannot be: by must be
// one of its approvers, not the requesting principal approving its own
// call unless SelfApprove, and r must be pending and unexpired. It
// changes nothing stored: a Store applies it atomically.
func (r Request) Decide(by Approver, approve bool, reason string, now time.Time) (Request, error) {
	switch {
	case !by.May(r):
		return Request{}, ErrNotApprover
	case approve && by.ID == r.Binding.Principal && !r.SelfApprove:
		return Request{}, ErrSelfApproval
	case r.At(now).State == Expired:
		return Request{}, ErrExpired
	case r.State != Pending:
		return Request{}, ErrDecided
	}
	r = r.clone()
	r.State, r.DecidedBy, r.DecidedAt, r.Reason = Denied, by.ID, now, reason
	if approve {
		r.State, r.Expires = Approved, now.Add(r.ApprovalTTL)
	}
	return r, nil
}

// Consume returns r consumed by a call bound as b at now, if r is an
// approval of exactly b that has not expired.
func (r Request) Consume(b Binding, now time.Time) (Request, bool) {
	if r.State != Approved || r.Binding != b || !now.Before(r.Expires) {
		return Request{}, false
	}
	r = r.clone()
	r.State = Consumed
	return r, true
}

// Expire returns r marked expired, if at now it is pending or approved
// past its Expires.
func (r Request) Expire(now time.Time) (Request, bool) {
	if r.At(now).State != Expired || r.State == Expired {
		return Request{}, false
	}
	r = r.clone()
	r.State = Expired
	return r, true
}

// Validate reports whether r is a request a Store may open at now.
func (r Request) Validate(now time.Time) error {
	switch {
	case !ValidID(r.ID):
		return fmt.Errorf("approval: request id %q is not one NewID makes", r.ID)
	case !r.Binding.complete():
		return fmt.Errorf("approval: request %s: every field of the binding is required", r.ID)
	case len(r.Approvers) == 0:
		return fmt.Errorf("approval: request %s names no approver", r.ID)
	case r.ApprovalTTL <= 0:
		return fmt.Errorf("approval: request %s: the approval TTL must be positive", r.ID)
	case r.State != Pending:
		return fmt.Errorf("approval: request %s opened %s, not pending", r.ID, r.State)
	case !now.Before(r.Expires):
		return fmt.Errorf("approval: request %s expires at %s, not after now", r.ID, r.Expires)
	}
	return nil
}

// clone is r with slices of its own, so that no caller's copy aliases a
// store's.
func (r Request) clone() Request {
	r.Arguments = slices.Clone(r.Arguments)
	r.Approvers = slices.Clone(r.Approvers)
	return r
}
