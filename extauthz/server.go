package extauthz

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/deny"
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
	Servers   []string
	Policy    *policy.Policy
	Principal config.Principal
	Limits    mcpparse.Limits
	// Audit receives one line per decision.
	Audit   zerolog.Logger
	Metrics *Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Server implements authv3.AuthorizationServer.
type Server struct {
	authv3.UnimplementedAuthorizationServer
	catalog   Catalog
	servers   map[string]bool
	policy    atomic.Pointer[policy.Policy]
	principal config.Principal
	limits    mcpparse.Limits
	audit     zerolog.Logger
	metrics   *Metrics
	now       func() time.Time
}

var _ authv3.AuthorizationServer = (*Server)(nil)

// New returns a Server. Policy and Catalog are required: capsnap never runs
// without something to decide against.
func New(o Options) (*Server, error) {
	if o.Catalog == nil || o.Policy == nil {
		return nil, errors.New("extauthz: catalog and policy are required")
	}
	s := &Server{
		catalog:   o.Catalog,
		servers:   map[string]bool{},
		principal: o.Principal,
		limits:    o.Limits,
		audit:     o.Audit,
		metrics:   o.Metrics,
		now:       o.Now,
	}
	for _, id := range o.Servers {
		s.servers[id] = true
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.policy.Store(o.Policy)
	return s, nil
}

// SetPolicy swaps in a reloaded policy for every decision that starts after
// it returns.
func (s *Server) SetPolicy(p *policy.Policy) { s.policy.Store(p) }

// Check decides one request. It never returns a gRPC error for a request it
// can read: Envoy would apply its failure mode instead of capsnap's answer.
func (s *Server) Check(_ context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	start := s.now()
	d := &decision{}
	d.fail = s.evaluate(req, d)
	elapsed := s.now().Sub(start)
	s.record(d, elapsed)
	return d.response(), nil
}

// decision collects what evaluate learned, for the response, the audit line
// and the metrics alike.
type decision struct {
	fail         *deny.Error
	requestID    string
	principal    string
	serverID     string
	session      string
	version      mcpparse.Version
	method       string
	id           json.RawMessage
	tool         string
	digest       string
	effect       policy.EffectClass
	policyDigest string
	// clientHeaders are the x-capsnap-* headers the client sent.
	clientHeaders []string
}

func (s *Server) evaluate(req *authv3.CheckRequest, d *decision) *deny.Error {
	attrs := req.GetAttributes()
	httpReq := attrs.GetRequest().GetHttp()
	headers := httpReq.GetHeaders()
	d.requestID = headers["x-request-id"]
	d.serverID = attrs.GetContextExtensions()[ServerIDKey]
	d.clientHeaders = clientHeaders(headers)

	// Parse. Only a POST carries JSON-RPC messages; the GET event stream
	// and the DELETE that ends a session carry none to verify.
	var msgs []mcpparse.Message
	switch httpReq.GetMethod() {
	case "GET", "DELETE":
		d.method = httpReq.GetMethod()
	case "POST":
		r, err := s.parse(httpReq)
		if err != nil {
			return err
		}
		d.version, d.session, msgs = r.Version, r.Session, r.Messages
		d.method, d.id = msgs[0].Method, msgs[0].ID
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

	// Look up and verify each call. A batch carries at most one, so the
	// digests pinned into the upstream headers name exactly one tool.
	var call *mcpparse.Message
	for i := range msgs {
		if msgs[i].Kind != mcpparse.KindRequest || msgs[i].Method != "tools/call" {
			continue
		}
		if call != nil {
			return deny.Errorf(deny.MalformedRequest, "a batch may carry at most one tools/call")
		}
		call = &msgs[i]
	}
	if call == nil {
		return nil
	}
	d.method, d.id, d.tool = call.Method, call.ID, call.Tool
	return s.verifyCall(d)
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
		if de, ok := deny.As(err); ok {
			return nil, de
		}
		return nil, deny.Errorf(deny.MalformedRequest, "%v", err)
	}
	return r, nil
}

// verifyCall holds one tools/call to the live catalog and the policy.
func (s *Server) verifyCall(d *decision) *deny.Error {
	list, _, err := s.catalog.Lookup(d.serverID)
	if err != nil {
		if de, ok := deny.As(err); ok {
			return de
		}
		return deny.Errorf(deny.CatalogUnavailable, "server %q: %v", d.serverID, err)
	}
	tool, ok := list.Tools[d.tool]
	if !ok {
		return deny.Errorf(deny.UnknownTool, "tool %q is not in server %q's live catalog", d.tool, d.serverID)
	}
	d.digest = tool.Digest
	rule, err := s.policy.Load().Decide(d.principal, d.serverID, d.tool)
	if err != nil {
		if de, ok := deny.As(err); ok {
			return de
		}
		return deny.Errorf(deny.ToolNotGranted, "%v", err)
	}
	d.effect, d.policyDigest = rule.Effect, rule.Digest
	return nil
}

// identify returns the acting principal from wherever the configuration
// says Envoy verified it.
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
