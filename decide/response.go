package decide

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/policy"
)

// CodeDenied is the JSON-RPC error code of every capsnap denial. JSON-RPC
// reserves -32768..-32000 and MCP defines no code for a policy refusal, so
// capsnap takes one outside that range; data.reason says which refusal.
const CodeDenied = -31000

// Headers capsnap sets. Every header with HeaderPrefix that a client sends
// is removed before the request reaches the upstream, so the upstream can
// trust them.
const (
	HeaderPrefix       = "x-capsnap-"
	HeaderReason       = "x-capsnap-reason"
	HeaderServerID     = "x-capsnap-server-id"
	HeaderTool         = "x-capsnap-tool"
	HeaderSchemaDigest = "x-capsnap-schema-digest"
	HeaderEffectClass  = "x-capsnap-effect-class"
	HeaderPolicyDigest = "x-capsnap-policy-digest"
	HeaderPrincipal    = "x-capsnap-principal"
	// HeaderEpoch carries the snapshot epoch: to the client on a tools/list
	// response, from the client on a tools/call (optional; it then must
	// match), and to the upstream on an allowed call.
	HeaderEpoch = "x-capsnap-epoch"
	// HeaderValidUntil tells the client when the epoch expires (RFC 3339).
	HeaderValidUntil = "x-capsnap-valid-until"
	// HeaderDrift is set on a capability_drift denial, to its reason.
	HeaderDrift = "x-capability-drift"
)

// Outcome is the decision on one request as an adapter answers it: a
// denial and its answer, or an allow and what it attaches. It names the
// request and what it was decided against either way, for the proxy's
// access log.
type Outcome struct {
	// Denial is why the request is refused; nil allows it. Status and
	// Body are then its answer, in the configured form (config.Denials):
	// an HTTP status and a JSON-RPC error, or a tool result.
	Denial *deny.Error
	Status int
	Body   []byte
	// Method is the request's MCP method (a batch's tools/call or
	// tools/list, else its first message's; a GET or DELETE's HTTP
	// method), and Name what MCP 2026-07-28's Mcp-Name header mirrors
	// (the tool, prompt or resource), both read from the body.
	Method, Name string
	ServerID     string
	Principal    string
	// Session is the request's MCP session, if its version has sessions,
	// and ProtocolVersion the version it speaks.
	Session, ProtocolVersion string
	// Tool, SchemaDigest, Effect and PolicyDigest are the pin a tools/call
	// was verified against: an allowed call carries them to the upstream,
	// with its Principal, Epoch, Envelope and Grant.
	Tool         string
	SchemaDigest string
	Effect       policy.EffectClass
	PolicyDigest string
	// Epoch is the snapshot's a tools/call was decided under, or the one an
	// allowed tools/list minted at the request (bind: catalog), which then
	// tells the client Epoch and ValidUntil.
	Epoch      string
	ValidUntil time.Time
	// Envelope is the signed envelope of an allowed tools/call, and Grant
	// the grant it is under, if any.
	Envelope, Grant string
	// Listing is the ticket of an allowed tools/list on the response path,
	// for its response's Deliver; Release that of an allowed tools/call
	// that reserved on a server whose failed calls give it back, for its
	// answer's Settle.
	Listing, Release string
	// ClientHeaders are the x-capsnap-* headers the client sent: none may
	// reach the upstream but as capsnap sets it.
	ClientHeaders []string
	// Observed is the denial config.ModeObserve did not enforce: the
	// request passes as if nothing had been verified, with no pin.
	Observed *deny.Error
	// ID is the JSON-RPC id of a request of one message that has one:
	// what an error written in place of its whole answer answers
	// (ResponseHead.ID), so that the client takes it for that answer.
	ID json.RawMessage
	// ElicitsURL marks an allowed initialize whose client declared
	// URL-mode elicitation: its answer's session is one an approval is
	// asked of as an elicitation (Server.Elicits).
	ElicitsURL bool
}

// Minted reports whether o allows a tools/list whose snapshot was minted
// at the request, whose answer then tells the client its epoch.
func (o *Outcome) Minted() bool {
	return o.Denial == nil && o.Observed == nil && o.Tool == "" && o.Epoch != ""
}

// Pinned reports whether o allows a tools/call on its verified pin, which
// it then carries to the upstream.
func (o *Outcome) Pinned() bool { return o.Denial == nil && o.Observed == nil && o.Tool != "" }

// outcome completes d's Outcome from what the decision learned.
func (d *decision) outcome(form config.Denials) {
	d.Session, d.ProtocolVersion = d.session, string(d.version)
	if !d.batch {
		d.ID = d.id
	}
	if d.snapshot != nil {
		d.Epoch, d.ValidUntil = d.snapshot.Epoch, d.snapshot.ValidUntil
	}
	switch {
	case d.Denial != nil && d.observed:
		d.Observed, d.Denial = d.Denial, nil
	case d.Denial != nil:
		d.Status, d.Body = d.denialBody(form)
	}
}

// errorBody is the JSON-RPC error object a denied request gets back, for the
// same id, so that an MCP client surfaces capsnap's reason instead of a bare
// HTTP status.
type errorBody struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   struct {
		Code    int       `json:"code"`
		Message string    `json:"message"`
		Data    errorData `json:"data"`
	} `json:"error"`
}

type errorData struct {
	Reason deny.Reason `json:"reason"`
	// Drift is true for a capability_drift denial.
	Drift bool `json:"capability_drift,omitempty"`
	// ReturnTo is what the caller must do next (deny.ReturnTo*).
	ReturnTo string `json:"return_to"`
	Detail   string `json:"detail,omitempty"`
	ServerID string `json:"server_id,omitempty"`
	Tool     string `json:"tool,omitempty"`
	Epoch    string `json:"epoch,omitempty"`
	// SnapshotDigest is the schema digest the snapshot pinned; LiveDigest
	// the one the server serves now.
	SnapshotDigest string `json:"snapshot_digest,omitempty"`
	LiveDigest     string `json:"live_digest,omitempty"`
	SnapshotPolicy string `json:"snapshot_policy_digest,omitempty"`
	// AllowedTools, on a denial that sends the caller back to planning,
	// are the tools its snapshot lets it call.
	AllowedTools []string `json:"allowed_tools,omitempty"`
	// Approval, on approval_required, is where a person approves the call.
	Approval *deny.ApprovalInfo `json:"approval,omitempty"`
	// Limit, on budget_exhausted and rate_limited, is the budget or rate
	// limit the call did not fit, and when it will.
	Limit *deny.LimitInfo `json:"limit,omitempty"`
	// RetryAt, RFC 3339, is when the same call may pass, where the rule
	// that denied it knows (outside_schedule).
	RetryAt string `json:"retry_at,omitempty"`
	// Review, on tool_under_review, is where a person reviews the change.
	Review *deny.ReviewInfo `json:"review,omitempty"`
	// Change, on schema_drift, is what changed.
	Change *deny.ChangeInfo `json:"change,omitempty"`
	// Supported and Requested, on a protocol version capsnap does not
	// speak, are MCP's UnsupportedProtocolVersionError's data.
	Supported []string `json:"supported,omitempty"`
	Requested string   `json:"requested,omitempty"`
}

// MetaKeyDenial is the _meta member of a tool result that denies a call
// (denials.call_form: tool_result): errorData, as a JSON-RPC error's data
// would carry it.
const MetaKeyDenial = "io.capsnap/denial"

// toolResultBody is a tools/call denial as a tool result: the model reads
// the text; code reads _meta. resultType is required by 2026-07-28 clients
// and ignored by earlier ones; there is no structuredContent, which a
// client would hold to the tool's outputSchema.
type toolResultBody struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		IsError    bool                 `json:"isError"`
		ResultType string               `json:"resultType"`
		Meta       map[string]errorData `json:"_meta"`
	} `json:"result"`
}

func (d *decision) toolResultJSON() []byte {
	var b toolResultBody
	b.JSONRPC, b.ID = "2.0", d.id
	data := d.errorData()
	text := "capsnap denied this call: " + string(data.Reason)
	if data.Drift {
		text = "capsnap denied this call: capability_drift " + string(data.Reason)
	}
	text += " (" + data.Detail + "). " + data.Reason.NextStep()
	if len(data.AllowedTools) > 0 {
		text += " Tools you may call: " + strings.Join(data.AllowedTools, ", ") + "."
	}
	b.Result.Content = append(b.Result.Content, struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}{"text", text})
	b.Result.IsError, b.Result.ResultType = true, "complete"
	b.Result.Meta = map[string]errorData{MetaKeyDenial: data}
	body, err := json.Marshal(b)
	if err != nil {
		return d.errorJSON() // cannot happen (strings and checked JSON), and would still deny
	}
	return body
}

// denialBody is the HTTP status and body a denial is answered with, in the
// configured form. A denial whose request id is unknown (the body could
// not be read) always takes the HTTP error: a 200 that answers id null is
// one no SDK client can match to its request (Python's waits for ever,
// Go's drops the session). So does a batch's: a 200 would leave its other
// requests unanswered.
func (d *decision) denialBody(form config.Denials) (int, []byte) {
	switch {
	// 2026-07-28's own answer for what a person must do at a URL, a
	// result: 200 whatever the form, as the client retries on a result.
	case d.urlElicitation && d.version == mcpparse.V20260728 && !declined(d.call):
		return 200, d.inputRequiredJSON()
	case d.urlElicitation && d.version == mcpparse.V20260728:
		return 200, d.errorJSON()
	// MCP's own error for what a person must do at a URL, as the client
	// asked for it, in whichever status the form answers with.
	case d.urlElicitation && form.Status == config.StatusHTTPError:
		return d.Denial.Reason.Spec().Status, d.urlElicitationJSON()
	case d.urlElicitation:
		return 200, d.urlElicitationJSON()
	case len(d.id) == 0 || d.batch || form.Status == config.StatusHTTPError:
		return d.Denial.Reason.Spec().Status, d.errorJSON()
	// MCP requires HTTP 400 with its own codes.
	case d.errorCode() != CodeDenied:
		return 400, d.errorJSON()
	case d.Method == "tools/call" && form.CallForm == config.CallFormToolResult:
		return 200, d.toolResultJSON()
	default:
		return 200, d.errorJSON()
	}
}

// errorJSON is the JSON-RPC error a denial answers its request with.
func (d *decision) errorJSON() []byte {
	var b errorBody
	b.JSONRPC = "2.0"
	b.ID = d.id
	if len(b.ID) == 0 {
		b.ID = json.RawMessage("null")
	}
	b.Error.Code = d.errorCode()
	b.Error.Message = "capsnap denied the request: " + string(d.Denial.Reason)
	if d.Denial.Reason.Drift() {
		b.Error.Message = "capability_drift: " + string(d.Denial.Reason) + "; return to " + d.Denial.Reason.ReturnTo()
	}
	b.Error.Data = d.errorData()
	if v := d.Denial.UnsupportedVersion; v != "" {
		b.Error.Data.Supported, b.Error.Data.Requested = mcpparse.SupportedVersions(), v
	}
	body, err := json.Marshal(b)
	if err != nil {
		// Every field is a string or already-validated JSON; this cannot
		// happen, and if it did the denial must still stand.
		body = []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-31000,"message":"capsnap denied the request"}}`)
	}
	return body
}

// errorCode is the JSON-RPC error code of d's denial: MCP's own where MCP
// has one (its headers disagreeing with the body, a protocol version
// capsnap does not speak), else capsnap's. data.reason says which denial
// it is either way.
func (d *decision) errorCode() int {
	switch {
	case d.Denial.UnsupportedVersion != "":
		return CodeUnsupportedProtocolVersion
	case d.Denial.Reason == deny.HeaderMismatch:
		return CodeHeaderMismatch
	}
	return CodeDenied
}

// MCP's error codes (2026-07-28) for what its transport requires of a
// request: answered with HTTP 400, whatever denials.status says.
const (
	CodeHeaderMismatch             = -32020
	CodeUnsupportedProtocolVersion = -32022
)

// errorData is what a denial tells the caller beyond its code and message.
func (d *decision) errorData() errorData {
	data := errorData{
		Reason: d.Denial.Reason, Drift: d.Denial.Reason.Drift(), ReturnTo: d.Denial.Reason.ReturnTo(),
		Detail: d.Denial.Detail, ServerID: d.ServerID, Tool: d.Tool,
		SnapshotDigest: d.SchemaDigest, LiveDigest: d.liveDigest, SnapshotPolicy: d.PolicyDigest,
		AllowedTools: d.allowedTools, Limit: d.Denial.Limit, Approval: d.Denial.Approval,
		Review: d.Denial.Review, Change: d.Denial.Change,
	}
	if d.snapshot != nil {
		data.Epoch = d.snapshot.Epoch
	}
	if !d.Denial.RetryAt.IsZero() {
		data.RetryAt = d.Denial.RetryAt.Format(time.RFC3339)
	}
	return data
}
