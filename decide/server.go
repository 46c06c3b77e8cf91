package decide

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/cache"
	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/policy"
)

// Catalog is capsnap's live view of each server's tools: the seam between
// the decision and however the view is kept (MCP client, static file).
type Catalog interface {
	Lookup(serverID string) (*catalog.List, catalog.Status, error)
}

var _ Catalog = (*catalog.Catalog)(nil)

// Options configure a Server.
type Options struct {
	Catalog Catalog
	// Servers are the configured server_ids; a route naming any other is
	// a misconfiguration and is denied.
	Servers []string
	// Rules are the policy (and lockfile) in force at start.
	Rules *Rules
	// Denials says how a denial is answered and whether it lists the tools
	// the caller's snapshot lets it call; the zero value answers with
	// config.StatusOK and config.CallFormError.
	Denials config.Denials
	// Snapshots stores the snapshots minted at tools/list.
	Snapshots cache.Backend
	// SnapshotTTL is how long a minted snapshot is valid.
	SnapshotTTL time.Duration
	// Bind is config.BindDelivered (a snapshot is minted from the
	// tools/list response, in Deliver) or config.BindCatalog (at the
	// request, from capsnap's own view); empty means BindDelivered.
	Bind string
	// MaxResponseBytes bounds a tools/list response Deliver reads; zero
	// means 1 MiB.
	MaxResponseBytes int
	// ListingKey authenticates the tickets a tools/list's Check hands its
	// response's Deliver; nil means a random key of this process.
	ListingKey []byte
	// Freshness bounds how stale a catalog may be for tools/call.
	Freshness config.Catalog
	Principal config.Principal
	Limits    mcpparse.Limits
	// Envelope, if set, signs the envelope of every allowed tools/call
	// (docs/ENVELOPE.md), valid for EnvelopeTTL (zero means 30s) and never
	// past the snapshot's valid_until.
	Envelope    *envelope.Keys
	EnvelopeTTL time.Duration
	// Grants are the grant keys of the servers that take envelopes under
	// a grant, by server_id: capsnap signs once per snapshot and tool for
	// those, and every other's envelopes whole.
	Grants map[string]*envelope.Recipient
	// Observe are the servers in config.ModeObserve: their decisions are
	// made, audited and counted, and none is enforced.
	Observe []string
	// Approvals, if set, is where the calls the policy holds for a
	// person's approval are asked and their approvals used; without it,
	// such a call fails closed (store_unavailable).
	Approvals *approval.Service
	// ReleaseOnError are the servers whose failed calls (a JSON-RPC error,
	// a tool result with isError) give back what they reserved of their
	// budgets and rate limits, through the response path (Settle).
	ReleaseOnError []string
	// Audit receives one line per decision.
	Audit   zerolog.Logger
	Metrics *Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// NewEpoch makes snapshot epochs; nil means cache.NewEpoch. Tests
	// replace it to get stable golden responses.
	NewEpoch func() string
}

// Server is the decision core: Decide for a request, Deliver for a
// tools/list's own answer, Screen for every other answer.
type Server struct {
	catalog Catalog
	servers map[string]bool
	// observe are the servers in config.ModeObserve.
	observe map[string]bool
	// elicitors are the sessions whose client takes URL elicitations
	// (elicitation.go).
	elicitors elicitors
	// releaseOnError are the servers of Options.ReleaseOnError, and
	// releaseKey seals their release tickets (release.go).
	releaseOnError map[string]bool
	releaseKey     []byte
	rules          atomic.Pointer[Rules]
	denials        config.Denials
	schemas        schemas
	snapshots      cache.Backend
	// counters hold the budgets and rate limits: the snapshot store's.
	counters policy.Counters
	// approvals are the approvals people gave (approvals.go), nil without
	// an approval service.
	approvals policy.Approvals
	ttl       time.Duration
	// delivered is true with config.BindDelivered.
	delivered   bool
	maxResponse int
	listingKey  []byte
	freshness   config.Catalog
	principal   config.Principal
	limits      mcpparse.Limits
	envelope    *envelope.Keys
	envelopeTTL time.Duration
	recipients  map[string]*envelope.Recipient
	grants      grants
	// mintGrant is envelope.Keys.Grant, but where a test makes minting
	// fail.
	mintGrant func(envelope.GrantClaims, *envelope.Recipient) (*envelope.Grant, error)
	auditLog  zerolog.Logger
	metrics   *Metrics
	now       func() time.Time
	newEpoch  func() string
	// unbound watches that the listings allowed come back through the
	// response path (unbound.go).
	unbound *unbound
	// passed are capsnap_deliveries_total{result="screened"} by server
	// label, resolved once: every answer to a decided request counts
	// there (Passed).
	passed map[string]prometheus.Counter
}

// New returns a Server. Rules, Catalog and Snapshots are required: capsnap
// never runs without something to decide against.
func New(o Options) (*Server, error) {
	if o.Catalog == nil || o.Rules == nil || o.Snapshots == nil {
		return nil, errors.New("decide: catalog, rules and snapshot store are required")
	}
	if o.SnapshotTTL <= 0 || o.Freshness.MaxAge <= 0 {
		return nil, errors.New("decide: snapshot TTL and catalog max age must be positive")
	}
	s := &Server{
		catalog:   o.Catalog,
		denials:   o.Denials,
		snapshots: o.Snapshots,
		ttl:       o.SnapshotTTL,
		freshness: o.Freshness,
		servers:   map[string]bool{},
		principal: o.Principal,
		limits:    o.Limits,
		auditLog:  o.Audit,
		metrics:   o.Metrics,
		now:       o.Now,
		newEpoch:  o.NewEpoch,

		envelope:    o.Envelope,
		envelopeTTL: o.EnvelopeTTL,
		recipients:  o.Grants,
		delivered:   o.Bind != config.BindCatalog,
		maxResponse: o.MaxResponseBytes,
		listingKey:  o.ListingKey,
	}
	if o.Bind != "" && o.Bind != config.BindDelivered && o.Bind != config.BindCatalog {
		return nil, fmt.Errorf("decide: bind %q is not %s or %s", o.Bind, config.BindDelivered, config.BindCatalog)
	}
	if s.maxResponse <= 0 {
		s.maxResponse = 1 << 20
	}
	if s.envelopeTTL <= 0 {
		s.envelopeTTL = 30 * time.Second
	}
	if s.envelope != nil {
		s.mintGrant = s.envelope.Grant
	}
	if s.listingKey == nil {
		s.listingKey = make([]byte, 32)
		_, _ = rand.Read(s.listingKey) // crypto/rand.Read never fails on supported platforms
	}
	s.releaseKey = releaseKey(s.listingKey)
	for _, id := range o.Servers {
		s.servers[id] = true
	}
	s.observe = map[string]bool{}
	for _, id := range o.Observe {
		if !s.servers[id] {
			return nil, fmt.Errorf("decide: observed server %q is not configured", id)
		}
		s.observe[id] = true
	}
	s.releaseOnError = map[string]bool{}
	for _, id := range o.ReleaseOnError {
		if !s.servers[id] {
			return nil, fmt.Errorf("decide: release_on_error server %q is not configured", id)
		}
		s.releaseOnError[id] = true
	}
	// The store that keeps snapshots keeps the budgets and rate limits
	// too: in this process, or shared by every replica.
	s.counters = o.Snapshots
	if o.Approvals != nil {
		s.approvals = approvals{o.Approvals}
	}
	s.unbound = newUnbound(o.Servers, o.Snapshots, s.metrics, s.delivered)
	if s.metrics != nil {
		s.passed = map[string]prometheus.Counter{"unknown": s.metrics.deliveries.WithLabelValues("unknown", ResultScreened)}
		for id := range s.servers {
			s.passed[id] = s.metrics.deliveries.WithLabelValues(id, ResultScreened)
		}
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.newEpoch == nil {
		s.newEpoch = cache.NewEpoch
	}
	s.SetRules(o.Rules)
	return s, nil
}

// CatalogChanged invalidates the tools a catalog change added, removed or
// redefined in every snapshot of serverID, through the store, so that every
// replica sharing it holds them void: a pin holds only while its tool has
// not changed since it was confirmed (Store.ChangedAt), even if it changed
// back. It is the catalog's OnChange, and never adds a tool to a snapshot:
// snapshots are immutable. A catalog's first list changes nothing anyone
// pinned.
func (s *Server) CatalogChanged(serverID string, _, next *catalog.List, changed []string) {
	if next.Generation <= 1 {
		return
	}
	s.metrics.invalidated(serverID, len(changed))
	// A store that cannot record it now keeps it, and denies every
	// decision, until it can (cache/redis).
	_ = s.snapshots.Invalidate(serverID, changed)
}

// Ready reports whether capsnap can decide calls: rules are in force (they
// always are once New returned) and every server's catalog is live by the
// same test a tools/call is held to.
func (s *Server) Ready() error {
	var ids []string
	for id := range s.servers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if _, fail := s.live(id, s.now()); fail != nil {
			return fail
		}
	}
	if _, err := s.snapshots.Seq(); err != nil {
		return storeFailed(err)
	}
	return nil
}

// Observed lists the servers in config.ModeObserve, sorted.
func (s *Server) Observed() []string {
	ids := slices.Collect(maps.Keys(s.observe))
	slices.Sort(ids)
	return ids
}

// SetRules puts rules in force for every decision that starts after it
// returns. Reload is the checked way to get here.
func (s *Server) SetRules(r *Rules) {
	s.rules.Store(r)
	s.metrics.policyInForce(r.Policy.Digest())
}

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
	// call is the tools/call message, whose arguments Parse checked.
	call *mcpparse.Message
	// liveDigest is what the catalog holds now, when it was compared with
	// the pinned SchemaDigest.
	liveDigest string
	// snapshot is the snapshot minted (tools/list) or verified against
	// (tools/call).
	snapshot *cache.Snapshot
	// staleRead marks a read allowed on its snapshot alone while the
	// catalog was unavailable.
	staleRead bool
	// allowedTools, for a tool_not_granted denial, are the tools the
	// principal may call instead.
	allowedTools []string
	// newest is the store's own newest snapshot, when a denial made on a
	// lagging pointer is decided again (lagged).
	newest *cache.Snapshot
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
		d.version, d.session, msgs = r.Version, r.Session, r.Messages
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

	// Look up and verify. A batch carries at most one tools/call or
	// tools/list, so the headers capsnap sets describe exactly one.
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
		d.Method, d.id, d.Name = m.Method, m.ID, ""
		if !s.delivered {
			return s.mint(d)
		}
		// Its response is read as holding one response, the list: the
		// answers to a batch's other requests beside it would be refused
		// with it (a client may take any of them for the list).
		for i := range msgs {
			if &msgs[i] != m && msgs[i].Kind == mcpparse.KindRequest {
				return deny.Errorf(deny.MalformedRequest, "on the response path a tools/list must not share a batch with other requests")
			}
		}
		return s.list(d, m)
	default:
		d.Method, d.id, d.Name, d.Tool, d.call = m.Method, m.ID, m.Tool, m.Tool, m
		// Kept whole, so that a denial decided again starts from it.
		called := *d
		if fail := s.verifyCall(d); fail != nil {
			newest := s.lagged(d, fail)
			if newest == nil {
				return fail
			}
			*d = called
			d.newest = newest
			if fail := s.verifyCall(d); fail != nil {
				return fail
			}
		}
		return nil
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
