// Package deny names the reasons capsnap refuses an MCP request.
//
// A Reason is at once the denial code sent to the caller, the audit record's
// "reason" and the value of the "reason" metric label, so the set is closed
// and every reason is made by a call to Errorf with one of the constants below.
// What a denial says beyond its detail (its HTTP status, where the caller
// goes next, whether it is capability drift) is the reason's row in one
// table, specs.
package deny

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Reason is a stable, machine-readable cause of a denial.
type Reason string

const (
	// MalformedRequest: the body is not one strict JSON-RPC/MCP message (or
	// batch) that every parser reads the same way.
	MalformedRequest Reason = "malformed_request"
	// HeaderMismatch: an MCP header (Mcp-Method, Mcp-Name,
	// MCP-Protocol-Version) disagrees with the body, or names a version
	// capsnap does not speak.
	HeaderMismatch Reason = "header_mismatch"
	// UnsupportedEncoding: the body is compressed; capsnap never guesses at
	// what a decompressor upstream would see.
	UnsupportedEncoding Reason = "unsupported_encoding"
	// UnsupportedMediaType: the body is not declared as JSON.
	UnsupportedMediaType Reason = "unsupported_media_type"
	// NoPrincipal: the request carries no verified identity.
	NoPrincipal Reason = "no_principal"
	// UnknownServer: the route names no server_id capsnap is configured for.
	UnknownServer Reason = "unknown_server"
	// CatalogUnavailable: capsnap has no live view of the server's tools.
	CatalogUnavailable Reason = "catalog_unavailable"
	// StoreUnavailable: the snapshot store that replicas share cannot be
	// read or written within its bound, so no snapshot can be minted or
	// verified.
	StoreUnavailable Reason = "store_unavailable"
	// EnvelopeFailed: capsnap could not sign the envelope of a call it
	// would allow, so the call is not allowed.
	EnvelopeFailed Reason = "envelope_failed"
	// UnknownTool: the tool is not in the server's live catalog.
	UnknownTool Reason = "unknown_tool"
	// UnclassifiedTool: the policy assigns the tool no effect class.
	UnclassifiedTool Reason = "unclassified_tool"
	// ToolNotGranted: the policy does not let this principal call the tool.
	ToolNotGranted Reason = "tool_not_granted"
	// ToolUnapproved: the policy's approvals lockfile does not approve
	// the tool's live digest, so it waits for review before it can join a
	// snapshot.
	ToolUnapproved Reason = "tool_unapproved"
	// ApprovalDenied: a person denied this exact call, and the denial
	// stands (Error.Approval names the request, the detail the reason).
	ApprovalDenied Reason = "approval_denied"
	// ToolUnderReview: the server changed the tool's definition (or lists
	// it for the first time), and the change waits for a reviewer
	// (Error.Review says where): the tool is in no snapshot meanwhile.
	ToolUnderReview Reason = "tool_under_review"
	// ToolChangeRejected: a reviewer rejected the definition the server
	// lists now; the tool stays out of every snapshot until the server
	// lists an approved definition or a later change is approved.
	ToolChangeRejected Reason = "tool_change_rejected"
	// InvalidArguments: the arguments do not satisfy the pinned inputSchema.
	InvalidArguments Reason = "invalid_arguments"
	// ConstraintViolation: the arguments break a constraint of the pinned
	// policy (a limit, an allowlist).
	ConstraintViolation Reason = "constraint_violation"
	// SequenceViolation: the policy requires another tool to have been
	// called first under the same snapshot.
	SequenceViolation Reason = "sequence_violation"
	// BudgetExhausted: the call's amount would take one of the pinned
	// policy's budgets past its limit in its window (Error.Limit says
	// which, and when the amount fits again).
	BudgetExhausted Reason = "budget_exhausted"
	// OutsideSchedule: the pinned policy allows the tool only inside time
	// windows, and the call is outside them (Error.RetryAt says when the
	// next one opens).
	OutsideSchedule Reason = "outside_schedule"
	// RateLimited: the call would exceed one of the pinned policy's rate
	// limits in its window (Error.Limit says which, and when to retry).
	RateLimited Reason = "rate_limited"
	// ApprovalRequired: the policy holds this call for a person's approval
	// of its exact arguments, and none is waiting to be used (Error.Approval
	// says where a person approves it).
	ApprovalRequired Reason = "approval_required"
	// MalformedResponse: a tools/list response on its way to the agent is
	// not one capsnap can read strictly (malformed, over the limit, an
	// unknown content type or encoding): it is never delivered unfiltered.
	MalformedResponse Reason = "malformed_response"
	// UnknownListing: a response reached capsnap's response path without a
	// valid ticket from the Check that allowed its tools/list: Envoy's
	// configuration sends capsnap responses it did not authorize.
	UnknownListing Reason = "unknown_listing"
	// ListingUnbound: a response that was not a tools/list's own answer (on
	// the GET event stream, a stream resumed with Last-Event-ID, another
	// request's stream or batch) carried a tools/list result, which a
	// client would take for its listing by id. capsnap cannot pin what it
	// would deliver, so it is withheld, answered with this error instead.
	ListingUnbound Reason = "listing_unbound"
	// UpstreamAborted: a tools/list's own answer came back through the
	// response path but ended before its body did (the server reset it
	// mid-listing): nothing was delivered, so nothing is pinned.
	UpstreamAborted Reason = "upstream_aborted"
	// NoSnapshot: the call has no snapshot to be verified against, or its
	// snapshot does not pin this tool on this server.
	NoSnapshot Reason = "no_snapshot"

	// The drift reasons: what the caller was authorized against has
	// changed since.

	// SchemaDrift: the tool's live definition is not the pinned one, or the
	// tool is gone.
	SchemaDrift Reason = "schema_drift"
	// PolicyDrift: the rules that decided this tool have changed.
	PolicyDrift Reason = "policy_drift"
	// PrincipalMismatch: the snapshot was minted for someone else.
	PrincipalMismatch Reason = "principal_mismatch"
	// EffectEscalation: the tool's effect class is now stronger than the
	// one that was reviewed.
	EffectEscalation Reason = "effect_escalation"
	// SnapshotExpired: the snapshot is past its valid_until.
	SnapshotExpired Reason = "snapshot_expired"
)

// Where a denied caller must go next.
const (
	// ReturnToPlanning: list tools again and re-plan against what is live.
	ReturnToPlanning = "planning"
	// ReturnToAuthorization: list tools again to be authorized under the
	// policy now in force.
	ReturnToAuthorization = "authorization"
	// ReturnToReview: stop; a person must review the stronger effect.
	ReturnToReview = "review"
	// ReturnToNone: nothing the caller can do will make this call valid.
	ReturnToNone = "none"
	// ReturnToLater: the same call may be allowed once the time the denial
	// names has passed (LimitInfo.RetryAfterSeconds, Retry-After).
	ReturnToLater = "later"
	// ReturnToApproval: the identical call may be allowed once, after a
	// person approves it at the URL the denial names (ApprovalInfo).
	ReturnToApproval = "approval"
)

// Spec is what a denial for one reason says beyond its detail, and the one
// place it is said: adding a reason is its constant above, its row in
// specs, and its row in docs/DENIALS.md's table of denials, which a test
// holds to this one.
type Spec struct {
	// Status is the HTTP status of the denial answered as an HTTP error
	// (denials.status http_error, or a request whose id is unknown). Every
	// denial of a request is a 4xx, whose JSON-RPC body the Go and Python
	// SDK clients read; a 5xx would be taken as transient and its body
	// dropped. Only the response path's own refusals, which no request
	// caused, are 5xx. The limits' 429 is the one 4xx the Go SDK also
	// takes as transient: it keeps the session and drops the body, and the
	// Retry-After header is what is left to act on.
	Status int
	// ReturnTo is where the caller must go next, a ReturnTo constant.
	ReturnTo string
	// Drift marks capability drift: the contract the caller planned
	// against is not the one that would run.
	Drift bool
}

var specs = map[Reason]Spec{
	SchemaDrift:       {Status: 403, ReturnTo: ReturnToPlanning, Drift: true},
	PolicyDrift:       {Status: 403, ReturnTo: ReturnToAuthorization, Drift: true},
	PrincipalMismatch: {Status: 403, ReturnTo: ReturnToNone, Drift: true},
	EffectEscalation:  {Status: 403, ReturnTo: ReturnToReview, Drift: true},
	SnapshotExpired:   {Status: 403, ReturnTo: ReturnToPlanning, Drift: true},

	NoSnapshot:          {Status: 403, ReturnTo: ReturnToPlanning},
	UnknownTool:         {Status: 403, ReturnTo: ReturnToPlanning},
	InvalidArguments:    {Status: 403, ReturnTo: ReturnToPlanning},
	ConstraintViolation: {Status: 403, ReturnTo: ReturnToPlanning},
	SequenceViolation:   {Status: 403, ReturnTo: ReturnToPlanning},
	BudgetExhausted:     {Status: 429, ReturnTo: ReturnToLater},
	RateLimited:         {Status: 429, ReturnTo: ReturnToLater},
	OutsideSchedule:     {Status: 429, ReturnTo: ReturnToLater},
	ApprovalRequired:    {Status: 403, ReturnTo: ReturnToApproval},
	ApprovalDenied:      {Status: 403, ReturnTo: ReturnToNone},
	ToolUnapproved:      {Status: 403, ReturnTo: ReturnToReview},
	ToolUnderReview:     {Status: 403, ReturnTo: ReturnToLater},
	ToolChangeRejected:  {Status: 403, ReturnTo: ReturnToPlanning},
	UnclassifiedTool:    {Status: 403, ReturnTo: ReturnToNone},
	ToolNotGranted:      {Status: 403, ReturnTo: ReturnToNone},
	CatalogUnavailable:  {Status: 403, ReturnTo: ReturnToNone},
	StoreUnavailable:    {Status: 403, ReturnTo: ReturnToNone},
	EnvelopeFailed:      {Status: 403, ReturnTo: ReturnToNone},
	NoPrincipal:         {Status: 403, ReturnTo: ReturnToNone},
	UnknownServer:       {Status: 403, ReturnTo: ReturnToNone},

	MalformedRequest:     {Status: 400, ReturnTo: ReturnToNone},
	HeaderMismatch:       {Status: 400, ReturnTo: ReturnToNone},
	UnsupportedEncoding:  {Status: 415, ReturnTo: ReturnToNone},
	UnsupportedMediaType: {Status: 415, ReturnTo: ReturnToNone},

	// The response path's: the server answered with something capsnap
	// cannot read or pin, or Envoy sent what capsnap did not authorize.
	MalformedResponse: {Status: 502, ReturnTo: ReturnToNone},
	ListingUnbound:    {Status: 502, ReturnTo: ReturnToPlanning},
	UpstreamAborted:   {Status: 502, ReturnTo: ReturnToPlanning},
	UnknownListing:    {Status: 500, ReturnTo: ReturnToNone},
}

// Spec is r's row. A reason without one is denied as forbidden, with
// nowhere to go: every reason is a constant above, and a test holds each to
// a row.
func (r Reason) Spec() Spec {
	if s, ok := specs[r]; ok {
		return s
	}
	return Spec{Status: 403, ReturnTo: ReturnToNone}
}

// Drift reports whether r is a capability_drift denial.
func (r Reason) Drift() bool { return r.Spec().Drift }

// ReturnTo says what a caller denied for r must do next.
func (r Reason) ReturnTo() string { return r.Spec().ReturnTo }

// NextStep tells a caller denied for r, in words a model acts on, what to
// do next.
func (r Reason) NextStep() string { return nextSteps[r.Spec().ReturnTo] }

var nextSteps = map[string]string{
	ReturnToPlanning:      "List the tools again and plan against what is listed now; do not retry this call as it is.",
	ReturnToAuthorization: "The policy changed: list the tools again to be authorized under the policy now in force.",
	ReturnToReview:        "Stop: this tool now does something more consequential than was reviewed, and a person must review it.",
	ReturnToNone:          "Nothing will make this call valid: do not retry it.",
	ReturnToLater:         "This call may be allowed later: retry it no sooner than data.retry_at or the seconds in data.limit.retry_after_seconds (the Retry-After header), or once the review at data.review.url is decided; meanwhile plan within what is allowed now.",
	ReturnToApproval:      "A person must approve this exact call first: show them data.approval.url, and once they approve, send the identical call again (once). Other arguments need another approval.",
}

// Error is a denial: a Reason and a human-readable detail for logs and the
// caller. It is the only error type the decision path returns to Envoy.
type Error struct {
	Reason Reason
	Detail string
	// Limit, set on a denial by a budget or rate limit (BudgetExhausted,
	// RateLimited, or ConstraintViolation for an amount no window could
	// hold), is what the planner needs to act: the adapters render it as
	// the JSON-RPC error's data.limit and, when it says when to retry, as
	// the Retry-After header of an HTTP error.
	Limit *LimitInfo
	// Approval, set on ApprovalRequired, is where a person approves the
	// call: the adapters render it as data.approval, or as MCP's URL
	// elicitation to a client that declared it.
	Approval *ApprovalInfo
	// RetryAt, set on a denial whose rule knows when the same call may
	// pass (a schedule's next window), is that time: the adapters render
	// it as data.retry_at and, in an HTTP error, the Retry-After header.
	RetryAt time.Time
	// Review, set on ToolUnderReview, is where a person reviews the
	// change: data.review.
	Review *ReviewInfo
	// Change, set on a SchemaDrift whose definitions capsnap has seen,
	// is what changed: data.change.
	Change *ChangeInfo
	// Cause, when set, is why the denial was made in terms only the
	// operator should read (a store's address and error): the audit line
	// carries it, the caller's answer never does.
	Cause string
	// UnsupportedVersion, set on a denial of a protocol version
	// capsnap does not speak, is the version asked for: the adapters
	// answer MCP's UnsupportedProtocolVersionError (-32022) with the
	// versions capsnap speaks.
	UnsupportedVersion string
}

// ReviewInfo is the review a changed tool waits on.
type ReviewInfo struct {
	ID  string `json:"id"`
	URL string `json:"url"`
	// ExpiresAt is when the review lapses undecided (a new one then opens).
	ExpiresAt time.Time `json:"expires_at"`
}

// ChangeInfo says what changed in a tool's definition: the kinds of change
// (tooldiff's names) and the fields they touch.
type ChangeInfo struct {
	Kinds  []string `json:"kinds"`
	Fields []string `json:"fields"`
}

// RetryAfter is the Retry-After header's value for e: the whole seconds
// of its Limit, else its RetryAt as an HTTP-date, else "".
func (e *Error) RetryAfter() string {
	if after := e.Limit.RetryAfter(); after != "" {
		return after
	}
	if e.RetryAt.IsZero() {
		return ""
	}
	return e.RetryAt.UTC().Format(http.TimeFormat)
}

// ApprovalInfo is the approval request an ApprovalRequired denial opened
// (or found still open) for the exact call.
type ApprovalInfo struct {
	ID  string `json:"id"`
	URL string `json:"url"`
	// ExpiresAt is when the request lapses unless a person decides it.
	ExpiresAt time.Time `json:"expires_at"`
	// Message says to a person what is asked, as an elicitation shows it.
	Message string `json:"message,omitempty"`
}

// LimitInfo is the state of the budget or rate limit that denied a call,
// in the policy's own units: a budget's sums what its amount expression
// evaluates to (USD, say), a rate limit's counts calls.
type LimitInfo struct {
	// Name is the budget's or rate limit's name in the policy: a bounded
	// label, unlike the principal whose counter it is.
	Name string `json:"name"`
	// Limit is the most the window may hold.
	Limit float64 `json:"limit"`
	// Used is what the window held when the call was denied, and Amount
	// what the call would have added (1 for a rate limit).
	Used   float64 `json:"used"`
	Amount float64 `json:"amount"`
	// WindowSeconds is the window's length.
	WindowSeconds int64 `json:"window_seconds"`
	// RetryAfterSeconds is how long until the same call fits, rounded up
	// to a whole second; 0 (and absent from the JSON) when it never will,
	// its amount being more than the limit.
	RetryAfterSeconds int64 `json:"retry_after_seconds,omitempty"`
}

// RetryAfter is the Retry-After header's value for l: whole seconds, or
// "" when there is no time after which the call fits.
func (l *LimitInfo) RetryAfter() string {
	if l == nil || l.RetryAfterSeconds <= 0 {
		return ""
	}
	return strconv.FormatInt(l.RetryAfterSeconds, 10)
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return string(e.Reason)
	}
	return string(e.Reason) + ": " + e.Detail
}

// Errorf returns a denial for reason r with a formatted detail.
func Errorf(r Reason, format string, args ...any) *Error {
	return &Error{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// As reports the denial inside err, if there is one.
func As(err error) (*Error, bool) {
	var d *Error
	ok := errors.As(err, &d)
	return d, ok
}
