// One request decided, top-down: parse the body, identify the principal,
// route it to what decides its method: call.go a tools/call, list.go a
// tools/list.

package decide

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
	"google.golang.org/protobuf/types/known/structpb"
)

// Request is one HTTP request of MCP's streamable HTTP transport, as the
// proxy in front of the server hands it over.
type Request struct {
	// Method is the HTTP method.
	Method string
	// Headers are the request's headers, by lower-case name.
	Headers map[string]string
	Body    []byte
	// Truncated says the proxy cut the body short: a prefix of a message
	// is not the message the server will read.
	Truncated bool
	// ServerID is the server the proxy's route will really send the
	// request to.
	ServerID string
	// Peer is the client's identity from its verified certificate, if any.
	Peer string
	// Metadata is what the proxy's filters before capsnap attached to the
	// request, by namespace: a verified token's claims among it.
	Metadata map[string]*structpb.Struct
}

// Decide decides one request. The Outcome is returned by value: the
// decision stays on the stack, where a pointer into it would move every
// decision to the heap.
func (s *Server) Decide(r *Request) Outcome {
	start := s.now()
	d := &decision{now: start}
	d.Denial = s.evaluate(r, d)
	d.observed = s.observe[d.ServerID]
	d.urlElicitation = d.Denial != nil && d.Denial.Reason == deny.ApprovalRequired && s.elicits(d)
	elapsed := s.now().Sub(start)
	s.record(d, elapsed)
	d.outcome(s.denials)
	return d.Outcome
}

// decision collects what evaluate learned: the Outcome, and beside it
// what only the audit line and the metrics read.
type decision struct {
	Outcome
	// now is when the decision began: the one instant its freshness and
	// expiry tests are made at.
	now       time.Time
	requestID string
	session   string
	version   mcpparse.Version
	id        json.RawMessage
	// call is the tools/call message, whose arguments Parse checked;
	// params are the request's Mcp-Param-* headers (mcpparse.Request).
	call   *mcpparse.Message
	params map[string]string
	// liveDigest is what the catalog holds now, when it was compared with
	// the pinned SchemaDigest.
	liveDigest string
	// snapshot is the snapshot minted (tools/list) or verified against
	// (tools/call).
	snapshot *store.Snapshot
	// staleRead marks a read allowed on its snapshot alone while the
	// catalog was unavailable.
	staleRead bool
	// withoutListing marks a call decided with no snapshot, on a server
	// that takes such calls (unlisted.go).
	withoutListing bool
	// allowedTools, for a tool_not_granted denial, are the tools the
	// principal may call instead.
	allowedTools []string
	// newest is the store's own newest snapshot, when a denial made on a
	// lagging pointer is decided again (lagged).
	newest *store.Snapshot
	// envelopeID is the envelope's jti, which the audit line names;
	// grantID that of the grant it is under, if any.
	envelopeID, grantID string
	// phase is "response" for a decision on a tools/list response.
	phase string
	// observed marks a decision on a server in config.ModeObserve, which
	// is made, audited and counted, and not enforced.
	observed bool
	// urlElicitation marks an approval_required denial to a client that
	// takes it as MCP's URL elicitation.
	urlElicitation bool
	// reserved are what an allowed call took from its budgets and rate
	// limits.
	reserved []policy.Reservation
	// batch is set for a batch of several messages, whose denial cannot
	// answer them all with one JSON-RPC error.
	batch bool
	// clientEpoch and clientDigest are the epoch and planned digest among
	// the client's x-capsnap-* headers.
	clientEpoch  string
	clientDigest string
}

func (s *Server) evaluate(req *Request, d *decision) *deny.Error {
	headers := req.Headers
	d.requestID = headers["x-request-id"]
	d.ServerID = req.ServerID
	d.ClientHeaders = clientHeaders(headers)
	d.clientEpoch, d.clientDigest = headers[HeaderEpoch], headers[HeaderSchemaDigest]

	// Parse. Only a POST carries JSON-RPC messages; the GET event stream
	// and the DELETE that ends a session carry none to verify.
	var msgs []mcpparse.Message
	switch req.Method {
	case "GET", "DELETE":
		d.Method = req.Method
	case "POST":
		r, err := s.parse(req)
		if err != nil {
			if r != nil && len(r.Messages) == 1 {
				d.Method, d.id, d.Name = r.Messages[0].Method, r.Messages[0].ID, r.Messages[0].Name()
			}
			return err
		}
		d.version, d.session, d.params, msgs = r.Version, r.Session, r.ParamHeaders, r.Messages
		// A batch is named by its first message, unless it carries the one
		// tools/call or tools/list capsnap decides on (below).
		d.Method, d.id, d.Name = msgs[0].Method, msgs[0].ID, msgs[0].Name()
		d.batch = len(msgs) > 1
	default:
		return deny.Errorf(deny.MalformedRequest, "HTTP method %q is not part of MCP's streamable HTTP transport", req.Method)
	}

	// Identify.
	principal, err := s.identify(req)
	if err != nil {
		return err
	}
	d.Principal = principal
	if !s.servers[d.ServerID] {
		return deny.Errorf(deny.UnknownServer, "route names server_id %q, which capsnap is not configured for", d.ServerID)
	}

	// Route. A batch carries at most one tools/call or tools/list, so the
	// headers capsnap sets describe exactly one.
	var m *mcpparse.Message
	for i := range msgs {
		method := msgs[i].Method
		if msgs[i].Kind != mcpparse.KindRequest || (method != "tools/call" && method != "tools/list") {
			continue
		}
		if m != nil {
			return deny.Errorf(deny.MalformedRequest, "a batch may carry at most one tools/call or tools/list")
		}
		m = &msgs[i]
	}
	switch {
	case m == nil:
		// An initialize is let through; its client may take an approval
		// as a URL elicitation, which its answer's session then says.
		d.ElicitsURL = len(msgs) == 1 && msgs[0].Method == "initialize" && elicitationOf(&msgs[0])
		return nil
	case m.Method == "tools/list":
		return s.listTools(d, msgs, m)
	default:
		return s.callTool(d, m)
	}
}

func (s *Server) parse(req *Request) (*mcpparse.Request, *deny.Error) {
	if req.Truncated {
		return nil, deny.Errorf(deny.MalformedRequest, "body was truncated by Envoy (allow_partial_message must be false)")
	}
	r, err := mcpparse.Parse(req.Body, req.Headers, s.limits)
	if err != nil {
		// r, if any, is the body read before the headers disagreed with
		// it: its id is what the denial answers.
		if de, ok := deny.As(err); ok {
			return r, de
		}
		return r, deny.Errorf(deny.MalformedRequest, "%v", err)
	}
	return r, nil
}

func (s *Server) identify(req *Request) (string, *deny.Error) {
	var p, from string
	switch s.principal.Source {
	case config.SourceMTLS:
		p, from = req.Peer, "the peer certificate (attributes.source.principal)"
	case config.SourceJWT:
		ns := req.Metadata[s.principal.JWT.MetadataNamespace]
		payload := ns.GetFields()[s.principal.JWT.PayloadKey].GetStructValue()
		p = payload.GetFields()[s.principal.JWT.Claim].GetStringValue()
		from = fmt.Sprintf("claim %q of the verified JWT in metadata %s.%s", s.principal.JWT.Claim, s.principal.JWT.MetadataNamespace, s.principal.JWT.PayloadKey)
	case config.SourceHeader:
		p, from = req.Headers[s.principal.Header], "header "+s.principal.Header
	}
	if p == "" {
		return "", deny.Errorf(deny.NoPrincipal, "no principal in %s", from)
	}
	if len(p) > maxPrincipalLen || strings.ContainsFunc(p, isControl) {
		return "", deny.Errorf(deny.NoPrincipal, "principal from %s is over %d bytes or has control characters", from, maxPrincipalLen)
	}
	return p, nil
}

const maxPrincipalLen = 1024

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

func clientHeaders(h map[string]string) []string {
	var out []string
	for k := range h {
		if strings.HasPrefix(k, HeaderPrefix) {
			out = append(out, k)
		}
	}
	return out
}
