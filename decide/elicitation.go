package decide

import (
	"encoding/json"
	"time"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/internal/bounded"
	"github.com/capsnap/capsnap/mcpparse"
)

// CodeURLElicitationRequired is MCP's URLElicitationRequiredError (2025-11-25):
// the request cannot proceed until the user completes the URL-mode
// elicitations in its data. 2026-07-28 removed it (a request that needs the
// user returns an InputRequiredResult instead), and never reuses it.
const CodeURLElicitationRequired = -32042

// InputRequestApproval is the key of capsnap's one entry in an
// InputRequiredResult's inputRequests, and so in the retry's
// inputResponses: a key no server assigns, which the server the retry
// reaches ignores (the SDK servers do; the spec asks them to).
const InputRequestApproval = "io.capsnap/approval"

// elicitors remembers the sessions whose client declared URL-mode
// elicitation at initialize, until sessionKept after: MCP 2025-11-25's
// clients declare capabilities once, on a request that has no session
// yet, so the initialize's answer (Elicits) says which session it was.
// It is this replica's: on another, the same denial takes capsnap's own
// form, which carries the same URL.
type elicitors = bounded.Map[string, time.Time]

const (
	sessionKept  = 24 * time.Hour
	maxElicitors = 1 << 16
)

// declaresURLElicitation reports whether caps, an MCP ClientCapabilities
// object, declares URL-mode elicitation: elicitation.url, names matched
// exactly as the SDKs match them.
func declaresURLElicitation(caps json.RawMessage) bool {
	var c map[string]json.RawMessage
	var e map[string]json.RawMessage
	if json.Unmarshal(caps, &c) != nil || json.Unmarshal(c["elicitation"], &e) != nil {
		return false
	}
	_, ok := e["url"]
	return ok
}

// elicitationOf is what m declares: initialize's params.capabilities, or
// a 2026-07-28 request's own client capabilities in params._meta.
func elicitationOf(m *mcpparse.Message) bool {
	if m.Method == "initialize" {
		var p map[string]json.RawMessage
		return json.Unmarshal(m.Params, &p) == nil && declaresURLElicitation(p["capabilities"])
	}
	var meta map[string]json.RawMessage
	return json.Unmarshal(m.Meta, &meta) == nil && declaresURLElicitation(meta["io.modelcontextprotocol/clientCapabilities"])
}

// Elicits records that the client of session, whose initialize's Check
// said it declared URL-mode elicitation, will take an approval as MCP's
// URL elicitation.
func (s *Server) Elicits(session string) {
	if session == "" || len(session) > 256 {
		return
	}
	s.elicitors.Store(session, s.now().Add(sessionKept), maxElicitors)
}

// elicits reports whether d's client takes an approval as a URL
// elicitation.
func (s *Server) elicits(d *decision) bool {
	if d.call != nil && elicitationOf(d.call) {
		return true
	}
	if d.session == "" {
		return false
	}
	until, ok := s.elicitors.Load(d.session)
	return ok && d.now.Before(until)
}

// urlElicitationJSON is an approval_required denial as MCP's
// URLElicitationRequiredError: one URL-mode elicitation, the approval page,
// whose elicitationId is the approval request's id.
func (d *decision) urlElicitationJSON() []byte {
	a := d.Denial.Approval
	var b struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Data    struct {
				Elicitations []urlElicitation `json:"elicitations"`
				// Capsnap is capsnap's own data, as any denial carries it.
				Capsnap errorData `json:"io.capsnap/denial"`
			} `json:"data"`
		} `json:"error"`
	}
	b.JSONRPC, b.ID = "2.0", d.id
	b.Error.Code = CodeURLElicitationRequired
	b.Error.Message = "capsnap: a person must approve this call: " + string(deny.ApprovalRequired)
	b.Error.Data.Elicitations = []urlElicitation{{Mode: "url", ElicitationID: a.ID, URL: a.URL, Message: a.Message}}
	b.Error.Data.Capsnap = d.errorData()
	body, err := json.Marshal(b)
	if err != nil {
		return d.errorJSON() // strings and checked JSON: cannot happen, and would still deny
	}
	return body
}

// declined reports whether m is the retry of a call whose user declined,
// or cancelled, capsnap's URL elicitation: its inputResponses answer
// capsnap's entry with another action than accept. It then gets the
// approval as an error, which ends the client's retry loop, rather than
// the same InputRequiredResult again.
func declined(m *mcpparse.Message) bool {
	var p struct {
		InputResponses map[string]json.RawMessage `json:"inputResponses"`
	}
	if m == nil || json.Unmarshal(m.Params, &p) != nil {
		return false
	}
	raw, ok := p.InputResponses[InputRequestApproval]
	if !ok {
		return false
	}
	var r struct {
		Action string `json:"action"`
	}
	return json.Unmarshal(raw, &r) != nil || r.Action != "accept"
}

// inputRequiredJSON is an approval_required denial as 2026-07-28 has a
// request that needs the user: a result, InputRequiredResult, with one
// URL-mode elicitation/create, the approval page. It carries no
// requestState: the retry is matched to the approval by what it binds
// (principal, tool, definition, policy, arguments; single use, expiring),
// and a requestState capsnap minted would reach the server, which is not
// capsnap's to strip (ext_authz cannot change a body) and which the Python
// SDK's server refuses as one it did not mint (-32602). The SDK clients
// retry with inputResponses and, there being none, no requestState; a
// retry while the person has not yet decided is answered the same way.
func (d *decision) inputRequiredJSON() []byte {
	a := d.Denial.Approval
	type elicit struct {
		Mode    string `json:"mode"`
		Message string `json:"message"`
		URL     string `json:"url"`
	}
	type inputRequest struct {
		Method string `json:"method"`
		Params elicit `json:"params"`
	}
	var b struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  struct {
			ResultType    string                  `json:"resultType"`
			InputRequests map[string]inputRequest `json:"inputRequests"`
			Meta          map[string]errorData    `json:"_meta"`
		} `json:"result"`
	}
	b.JSONRPC, b.ID = "2.0", d.id
	b.Result.ResultType = "input_required"
	b.Result.InputRequests = map[string]inputRequest{InputRequestApproval: {Method: "elicitation/create",
		Params: elicit{Mode: "url", Message: a.Message + ": open the page, decide, then continue", URL: a.URL}}}
	b.Result.Meta = map[string]errorData{MetaKeyDenial: d.errorData()}
	body, err := json.Marshal(b)
	if err != nil {
		return d.errorJSON() // strings and checked JSON: cannot happen, and would still deny
	}
	return body
}

type urlElicitation struct {
	Mode          string `json:"mode"`
	ElicitationID string `json:"elicitationId"`
	URL           string `json:"url"`
	Message       string `json:"message"`
}
