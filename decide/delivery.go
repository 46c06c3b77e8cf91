package decide

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// listing is what the request half of a tools/list (the Check) hands its
// response half (Deliver), through Envoy's dynamic metadata: who listed,
// where and in which session, and which JSON-RPC id the response answers.
type listing struct {
	Principal string           `json:"p"`
	ServerID  string           `json:"s"`
	Session   string           `json:"x,omitempty"`
	Version   mcpparse.Version `json:"v"`
	ID        json.RawMessage  `json:"i"`
	// Cursor is the request's params.cursor: the page continues the
	// snapshot whose NextCursor it is.
	Cursor    string `json:"c,omitempty"`
	RequestID string `json:"r,omitempty"`
	Expires   int64  `json:"e"`
}

// seal makes the listing's ticket: its JSON and a MAC under the server's
// listing key, both base64url. The response half trusts a ticket only
// under that MAC, so that a caller of the ext_proc service cannot mint a
// snapshot that no Check allowed the listing of.
func (s *Server) seal(l listing) string { return sealWith(s.listingKey, l) }

func (s *Server) open(ticket string, now time.Time) (listing, error) {
	var l listing
	if err := openWith(s.listingKey, "listing", ticket, &l); err != nil {
		return l, err
	}
	if now.Unix() > l.Expires {
		return l, errors.New("the listing ticket has expired")
	}
	return l, nil
}

// sealWith is v's JSON and its MAC under key, both base64url: a ticket a
// Check hands the response path through Envoy's dynamic metadata.
func sealWith(key []byte, v any) string {
	payload, _ := json.Marshal(v) // strings, validated JSON, integers
	mac := hmac.New(sha256.New, key)
	mac.Write(payload)
	return base64.RawURLEncoding.EncodeToString(payload) + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// openWith reads a kind of ticket sealWith made under key into v.
func openWith(key []byte, kind, ticket string, v any) error {
	p, m, ok := strings.Cut(ticket, ".")
	if !ok {
		return fmt.Errorf("the %s ticket is not payload.mac", kind)
	}
	payload, err1 := base64.RawURLEncoding.DecodeString(p)
	sum, err2 := base64.RawURLEncoding.DecodeString(m)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("the %s ticket is not base64url", kind)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(payload)
	if !hmac.Equal(sum, mac.Sum(nil)) {
		return fmt.Errorf("the %s ticket's MAC does not verify", kind)
	}
	if err := json.Unmarshal(payload, v); err != nil {
		return fmt.Errorf("the %s ticket: %w", kind, err)
	}
	return nil
}

// ResponseHead is what Deliver needs of a response's headers.
type ResponseHead struct {
	// Status is the HTTP status.
	Status          int
	ContentType     string
	ContentEncoding string
	// Streamed is set when the body came in parts that each wanted an
	// answer of its own (STREAMED): a response path that neither buffers
	// it nor streams it in full duplex cannot read or rewrite it whole.
	Streamed bool
	// CapsnapHeaders are the x-capsnap-* headers the server sent, which
	// never reach the agent.
	CapsnapHeaders []string
	// Session is the Mcp-Session-Id the server answered with, if any.
	Session string
	// ID is the JSON-RPC id of the request this answers (Outcome.ID),
	// which an error that takes the place of the whole answer, or of an
	// event of it, carries; nil for a GET stream's, a batch's, or a
	// notification's.
	ID json.RawMessage
}

// Delivery is the decision on one tools/list response.
type Delivery struct {
	// Fail is set when the response must not reach the agent; Body is
	// then the JSON-RPC error the agent gets instead, with Status.
	Fail   *deny.Error
	Status int
	// Body is what the agent is delivered: the response rewritten to
	// exactly the pinned tools, or the error. Nil leaves the server's
	// response as it is (a JSON-RPC error from the server itself).
	Body []byte
	// Headers are set on what is delivered: the epoch of the snapshot
	// that pins exactly the delivered tools, or the denial's reason.
	Headers [][2]string
	// Withheld are the tools the server sent that the agent is not
	// delivered, by name, with why.
	Withheld []Withheld
}

// Withheld is a tool left out of what the agent is delivered.
type Withheld struct {
	Tool   string      `json:"tool"`
	Reason deny.Reason `json:"reason"`
	Detail string      `json:"detail"`
}

// MaxResponseBytes is the most of a tools/list response Deliver reads
// (discovery.max_response_bytes): an adapter that gathers a body in parts
// stops there.
func (s *Server) MaxResponseBytes() int { return s.maxResponse }

// Deliver is the authorize boundary on the response path. It reads the
// tools/list response the server sent (its head and whole body, as
// Envoy's ext_proc filter streams or buffers it) for the listing its ticket names, mints a
// snapshot over exactly the delivered tools that the policy grants, the
// lockfile approves and capsnap's live view confirms at the same digest,
// and returns the response rewritten to exactly those: the list the agent
// plans against and the list its calls are held to are one list.
func (s *Server) Deliver(ticket string, head ResponseHead, body []byte) *Delivery {
	start := s.now()
	d := &decision{now: start, Outcome: Outcome{Method: "tools/list"}, phase: "response"}
	out := &Delivery{}
	d.Denial = s.deliver(d, out, ticket, head, body)
	d.observed = s.observe[d.ServerID]
	s.recordDelivery(d, out, s.now().Sub(start))
	switch {
	case d.observed:
		// Decided, audited and counted; the agent gets what the server
		// sent, and the epoch of the snapshot minted over what it would
		// have been delivered.
		out.Fail, out.Body, out.Headers = nil, nil, nil
		if d.Denial == nil && d.snapshot != nil {
			out.Headers = epochHeaders(d.snapshot)
		}
	case d.Denial != nil:
		// The response is replaced whole: nothing was withheld from a
		// delivery that did not happen.
		out.Fail, out.Withheld = d.Denial, nil
		out.Status, out.Body = d.denialBody(s.denials)
		out.Headers = [][2]string{{"content-type", "application/json"}, {HeaderReason, string(d.Denial.Reason)}}
	case d.snapshot != nil:
		out.Headers = epochHeaders(d.snapshot)
	}
	return out
}

// Aborted records a tools/list's own answer that came back through the
// response path with ticket and ended before its body did: the server
// reset it mid-listing (head is its headers, or zero when Envoy ended the
// exchange before it sent them), and Envoy ended the exchange with no
// body for Deliver. Nothing was delivered, so nothing is pinned; the ticket is
// redeemed, so the listing is not taken for one whose response path is
// missing (capsnap_delivery_unbound_total); and it is audited and counted
// as what it is, upstream_aborted.
func (s *Server) Aborted(ticket string, head ResponseHead) {
	start := s.now()
	d := &decision{now: start, Outcome: Outcome{Method: "tools/list"}, phase: "response"}
	if _, d.Denial = s.redeem(d, ticket); d.Denial == nil {
		what := fmt.Sprintf("the server's tools/list answer (HTTP %d) ended before its body did", head.Status)
		if head.Status == 0 {
			what = "the server's tools/list answer ended as soon as its headers reached Envoy's ext_proc filter"
		}
		d.Denial = deny.Errorf(deny.UpstreamAborted, "%s: nothing was delivered, and nothing pinned", what)
	}
	d.observed = s.observe[d.ServerID]
	s.recordDelivery(d, &Delivery{}, s.now().Sub(start))
}

// epochHeaders tell the agent the snapshot a listing minted.
func epochHeaders(snap *store.Snapshot) [][2]string {
	return [][2]string{
		{HeaderEpoch, snap.Epoch},
		{HeaderValidUntil, snap.ValidUntil.UTC().Format(time.RFC3339)},
	}
}

func (s *Server) deliver(d *decision, out *Delivery, ticket string, head ResponseHead, body []byte) *deny.Error {
	l, fail := s.redeem(d, ticket)
	if fail != nil {
		return fail
	}
	switch {
	case head.Status < 100 || head.Status > 599:
		return deny.Errorf(deny.MalformedResponse, "the tools/list response has no valid HTTP status (%d): Envoy's ext_proc response_header_mode must be SEND", head.Status)
	// A body in parts or over the bound is only part of the response,
	// whatever its status: none of it passes.
	case head.Streamed:
		return deny.Errorf(deny.MalformedResponse, "the tools/list response came in parts: Envoy's ext_proc response_body_mode must be FULL_DUPLEX_STREAMED or BUFFERED")
	case len(body) > s.maxResponse:
		// At least: a body streamed in full duplex is read no further.
		return deny.Errorf(deny.MalformedResponse, "the tools/list response is over discovery.max_response_bytes %d (at least %d bytes)", s.maxResponse, len(body))
	}
	resp, fail := s.readListing(head, body, l.ID)
	if resp == nil {
		return fail
	}
	snap, fail := s.newSnapshot(d)
	if fail != nil {
		return fail
	}
	live, fail := s.live(d.ServerID, d.now)
	if fail != nil {
		return fail
	}
	snap.NextCursor = resp.NextCursor
	// A later page continues the snapshot of the pages before it, so that
	// a call is held to whichever page delivered its tool: the pins carry
	// over with the sequence that confirmed each, and so does the lifetime.
	prev, ok, fail := s.continues(d, l.Cursor)
	if fail != nil {
		return fail
	}
	if ok {
		snap.Pins = slices.Clone(prev.Pins)
		snap.ValidUntil = prev.ValidUntil
	}
	r := s.rules.Load()
	earlier := make(map[string]string, len(snap.Pins))
	for _, p := range snap.Pins {
		earlier[p.ToolID] = p.SchemaDigest
	}
	keep := make([]bool, len(resp.Tools))
	principal := r.Policy.For(d.Principal)
	gate := s.changeGate(r, d.ServerID, live, d.now)
	for i, t := range resp.Tools {
		rule, w := s.withhold(d, r, principal, live, t)
		if w == nil {
			w = gate.admit(t.Name, rule)
		}
		if w == nil && earlier[t.Name] != "" && earlier[t.Name] != t.Digest {
			w = deny.Errorf(deny.SchemaDrift, "delivered at %s, but an earlier page delivered it at %s", t.Digest, earlier[t.Name])
		}
		if w != nil {
			out.Withheld = append(out.Withheld, Withheld{Tool: t.Name, Reason: w.Reason, Detail: w.Detail})
			continue
		}
		keep[i] = true
		if earlier[t.Name] == "" {
			snap.Pins = append(snap.Pins, store.Pin{ToolID: t.Name, SchemaDigest: t.Digest, Effect: rule.Effect, PolicyDigest: rule.Digest, Seq: snap.Seq})
		}
	}
	if fail := s.store(d, snap); fail != nil {
		return fail
	}
	out.Body = resp.Rewrite(keep, snap.ValidUntil.Sub(d.now).Milliseconds())
	return nil
}

// redeem opens the listing ticket a tools/list's answer came back with,
// fills d with who listed what, where, and notes the ticket redeemed: the
// answer came back through the response path, whatever it answers. A
// ticket that does not open is unknown_listing.
func (s *Server) redeem(d *decision, ticket string) (listing, *deny.Error) {
	l, err := s.open(ticket, d.now)
	if err != nil {
		return l, deny.Errorf(deny.UnknownListing, "%v: Envoy must send capsnap only the responses of tools/list requests capsnap allowed, with the ext_authz filter's metadata", err)
	}
	d.Principal, d.ServerID, d.session, d.version, d.id, d.requestID = l.Principal, l.ServerID, l.Session, l.Version, l.ID, l.RequestID
	s.unbound.redeemed(l.ServerID, ticket, d.now)
	return l, nil
}

// withhold decides whether a delivered tool can be pinned: the rule that
// grants it, or why not (not granted, unclassified, unapproved at the
// delivered digest, not in capsnap's live view, live at another digest).
func (s *Server) withhold(d *decision, r *Rules, principal *policy.Principal, list *catalog.List, t mcpparse.DeliveredTool) (policy.Decision, *deny.Error) {
	rule, fail := r.admit(principal, d.ServerID, t.Name, t.Digest)
	if fail != nil {
		return rule, fail
	}
	live, ok := list.Tools[t.Name]
	if !ok {
		return rule, deny.Errorf(deny.UnknownTool, "delivered at %s, but capsnap's live view of %s has no tool %q", t.Digest, d.ServerID, t.Name)
	}
	if live.Digest != t.Digest {
		return rule, deny.Errorf(deny.SchemaDrift, "delivered at %s, but capsnap's live view has it at %s", t.Digest, live.Digest)
	}
	return rule, nil
}

// readListing reads a successful tools/list response answering id. Only
// such a listing is rewritten. Any other answer (the server's own error,
// whatever its id: a 404 "session not found" has id null; an empty body; a
// page no client reads as JSON-RPC) delivers no tools and passes as the
// server sent it, with no snapshot and no epoch, so nil and no denial: an
// MCP client's own recovery depends on it. What some client could read as
// a result but capsnap cannot read strictly is refused.
func (s *Server) readListing(head ResponseHead, body []byte, id json.RawMessage) (*mcpparse.Delivery, *deny.Error) {
	var err error
	switch {
	case head.Status < 200 || head.Status > 299:
		// Some client reads a result under any status (Python's takes a
		// 3xx's for the answer; TypeScript's puts a 500's body into the
		// error its agent sees).
		err = fmt.Errorf("a tools/list response with HTTP status %d carries a JSON-RPC result", head.Status)
	case mcpparse.Encoded(head.ContentEncoding):
		err = fmt.Errorf("the tools/list response is %s-encoded: capsnap never guesses at what a decompressor would deliver", head.ContentEncoding)
	default:
		// Every delivered tool's digest is needed, withheld or not: a
		// tool capsnap cannot digest makes the whole list one it cannot
		// vouch for. ReadDelivery remembers digests by the definition's
		// bytes (mcpparse/digestcache.go), so an unchanged server's list
		// costs a strict check and a hash per tool, not a
		// canonicalization (issue 17).
		var resp *mcpparse.Delivery
		if resp, err = mcpparse.ReadDelivery(head.ContentType, body, id, s.limits.MaxDepth); err == nil && !resp.Error {
			return resp, nil
		}
	}
	if !mcpparse.CarriesResult(head.ContentType, head.ContentEncoding, body, s.limits.MaxDepth) {
		return nil, nil
	}
	return nil, deny.Errorf(deny.MalformedResponse, "%v", err)
}

// continues returns the snapshot a page request with cursor continues: the
// newest one for the same principal, server and session (Latest's key),
// still valid, whose page's nextCursor was cursor.
func (s *Server) continues(d *decision, cursor string) (*store.Snapshot, bool, *deny.Error) {
	if cursor == "" {
		return nil, false, nil
	}
	prev, ok, err := s.snapshots.Latest(d.Principal, d.ServerID, d.session)
	if err != nil {
		return nil, false, storeFailed(err)
	}
	if !ok || prev.NextCursor != cursor || !d.now.Before(prev.ValidUntil) {
		return nil, false, nil
	}
	return prev, true, nil
}
