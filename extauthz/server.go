package extauthz

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/rs/zerolog"

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

// ServerIDKey is the context_extensions key through which Envoy's route
// names the server a request will really be sent to.
const ServerIDKey = "server_id"

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
	Snapshots cache.Store
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
	// Audit receives one line per decision.
	Audit   zerolog.Logger
	Metrics *Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// NewEpoch makes snapshot epochs; nil means cache.NewEpoch. Tests
	// replace it to get stable golden responses.
	NewEpoch func() string
}

// Server implements authv3.AuthorizationServer.
type Server struct {
	authv3.UnimplementedAuthorizationServer
	catalog Catalog
	servers map[string]bool
	rules   atomic.Pointer[Rules]
	denials config.Denials
	schemas schemas
	// pinHeaders are the shared headers of allowed calls (response.go).
	pinHeaders pinHeaders
	snapshots  cache.Store
	ttl        time.Duration
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
}

var _ authv3.AuthorizationServer = (*Server)(nil)

// New returns a Server. Rules, Catalog and Snapshots are required: capsnap
// never runs without something to decide against.
func New(o Options) (*Server, error) {
	if o.Catalog == nil || o.Rules == nil || o.Snapshots == nil {
		return nil, errors.New("extauthz: catalog, rules and snapshot store are required")
	}
	if o.SnapshotTTL <= 0 || o.Freshness.MaxAge <= 0 {
		return nil, errors.New("extauthz: snapshot TTL and catalog max age must be positive")
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
		return nil, fmt.Errorf("extauthz: bind %q is not %s or %s", o.Bind, config.BindDelivered, config.BindCatalog)
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
	for _, id := range o.Servers {
		s.servers[id] = true
	}
	shared, _ := o.Snapshots.(cache.Redemptions)
	s.unbound = newUnbound(o.Servers, shared, s.metrics, s.delivered)
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

// SetRules puts rules in force for every decision that starts after it
// returns. Reload is the checked way to get here.
func (s *Server) SetRules(r *Rules) {
	s.rules.Store(r)
	s.metrics.policyInForce(r.Policy.Digest())
}

// Check decides one request. It never returns a gRPC error for a request it
// can read: Envoy would apply its failure mode instead of capsnap's answer.
func (s *Server) Check(_ context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	start := s.now()
	d := &decision{now: start}
	d.fail = s.evaluate(req, d)
	elapsed := s.now().Sub(start)
	s.record(d, elapsed)
	return d.response(&s.pinHeaders, s.denials), nil
}

// decision collects what evaluate learned, for the response, the audit line
// and the metrics alike.
type decision struct {
	// now is when the decision began: the one instant its freshness and
	// expiry tests are made at.
	now       time.Time
	fail      *deny.Error
	requestID string
	principal string
	serverID  string
	session   string
	version   mcpparse.Version
	method    string
	id        json.RawMessage
	// name is what 2026-07-28's Mcp-Name header mirrors (the tool, prompt
	// or resource the request names), read from the body in every
	// version, for the access log.
	name string
	tool string
	// call is the tools/call message, whose arguments Parse checked.
	call         *mcpparse.Message
	effect       policy.EffectClass
	policyDigest string
	// digest is the pinned schema digest; liveDigest what the catalog
	// holds now, when they were compared.
	digest     string
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
	// envelope is the signed envelope of an allowed tools/call, and
	// envelopeID its jti, which the audit line names; grant is the grant
	// it is under, if any, and grantID that grant's jti.
	envelope, envelopeID string
	grant, grantID       string
	// listing is the ticket of an allowed tools/list on the response path,
	// for its response's Deliver.
	listing string
	// phase is "response" for a decision on a tools/list response.
	phase string
	// batch is set for a batch of several messages, whose denial cannot
	// answer them all with one JSON-RPC error.
	batch bool
	// clientHeaders are the x-capsnap-* headers the client sent;
	// clientEpoch and clientDigest the epoch and planned digest among them.
	clientHeaders []string
	clientEpoch   string
	clientDigest  string
}

func (s *Server) evaluate(req *authv3.CheckRequest, d *decision) *deny.Error {
	attrs := req.GetAttributes()
	httpReq := attrs.GetRequest().GetHttp()
	headers := httpReq.GetHeaders()
	d.requestID = headers["x-request-id"]
	d.serverID = attrs.GetContextExtensions()[ServerIDKey]
	d.clientHeaders = clientHeaders(headers)
	d.clientEpoch, d.clientDigest = headers[HeaderEpoch], headers[HeaderSchemaDigest]

	// Parse. Only a POST carries JSON-RPC messages; the GET event stream
	// and the DELETE that ends a session carry none to verify.
	var msgs []mcpparse.Message
	switch httpReq.GetMethod() {
	case "GET", "DELETE":
		d.method = httpReq.GetMethod()
	case "POST":
		r, err := s.parse(httpReq)
		if err != nil {
			if r != nil && len(r.Messages) == 1 {
				d.method, d.id, d.name = r.Messages[0].Method, r.Messages[0].ID, r.Messages[0].Name()
			}
			return err
		}
		d.version, d.session, msgs = r.Version, r.Session, r.Messages
		// A batch is named by its first message, unless it carries the one
		// tools/call or tools/list capsnap decides on (below).
		d.method, d.id, d.name = msgs[0].Method, msgs[0].ID, msgs[0].Name()
		d.batch = len(msgs) > 1
	default:
		return deny.Errorf(deny.MalformedRequest, "HTTP method %q is not part of MCP's streamable HTTP transport", httpReq.GetMethod())
	}

	// Identify.
	principal, err := s.identify(attrs)
	if err != nil {
		return err
	}
	d.principal = principal
	if !s.servers[d.serverID] {
		return deny.Errorf(deny.UnknownServer, "route names server_id %q, which capsnap is not configured for", d.serverID)
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
		return nil
	case m.Method == "tools/list":
		d.method, d.id, d.name = m.Method, m.ID, ""
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
		d.method, d.id, d.name, d.tool, d.call = m.Method, m.ID, m.Tool, m.Tool, m
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

func (s *Server) parse(h *authv3.AttributeContext_HttpRequest) (*mcpparse.Request, *deny.Error) {
	// Envoy marks a body it cut at max_request_bytes; a prefix of the
	// message is not the message the server will read.
	if h.GetHeaders()["x-envoy-auth-partial-body"] == "true" {
		return nil, deny.Errorf(deny.MalformedRequest, "body was truncated by Envoy (allow_partial_message must be false)")
	}
	body := h.GetRawBody()
	if len(body) == 0 && h.GetBody() != "" {
		body = []byte(h.GetBody())
	}
	r, err := mcpparse.Parse(body, h.GetHeaders(), s.limits)
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

func (s *Server) identify(attrs *authv3.AttributeContext) (string, *deny.Error) {
	var p, from string
	switch s.principal.Source {
	case config.SourceMTLS:
		p, from = attrs.GetSource().GetPrincipal(), "the peer certificate (attributes.source.principal)"
	case config.SourceJWT:
		ns := attrs.GetMetadataContext().GetFilterMetadata()[s.principal.JWT.MetadataNamespace]
		payload := ns.GetFields()[s.principal.JWT.PayloadKey].GetStructValue()
		p = payload.GetFields()[s.principal.JWT.Claim].GetStringValue()
		from = fmt.Sprintf("claim %q of the verified JWT in metadata %s.%s", s.principal.JWT.Claim, s.principal.JWT.MetadataNamespace, s.principal.JWT.PayloadKey)
	case config.SourceHeader:
		p, from = attrs.GetRequest().GetHttp().GetHeaders()[s.principal.Header], "header "+s.principal.Header
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
