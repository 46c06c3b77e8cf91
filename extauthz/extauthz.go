// Package extauthz adapts Envoy's external-authorization API
// (envoy.service.auth.v3.Authorization) to capsnap's decision core, package
// decide: it reads each Check's HTTP request, with its body, into a
// decide.Request, and answers the Outcome as Envoy applies it. An allow
// pins what was verified into headers for the upstream; a denial is the
// HTTP answer the client gets, a JSON-RPC error an MCP client can read.
// Both carry the decision as dynamic metadata for Envoy's access log and
// its ext_proc filter. It decides nothing itself.
package extauthz

import (
	"context"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/tracing"
)

// ServerIDKey is the context_extensions key through which Envoy's route
// names the server a request will really be sent to.
const ServerIDKey = "server_id"

// Server implements authv3.AuthorizationServer.
type Server struct {
	authv3.UnimplementedAuthorizationServer
	core *decide.Server
	// tracer, if set, makes a span of each decision (trace.go).
	tracer trace.Tracer
	// pins are the shared headers of allowed calls (response.go).
	pins pinHeaders
}

var _ authv3.AuthorizationServer = (*Server)(nil)

// New returns a Server that has core decide every Check, and, with a
// tracer, makes a span of each decision in the trace Envoy started.
func New(core *decide.Server, tracer trace.Tracer) *Server {
	return &Server{core: core, tracer: tracer}
}

// Check decides one request. It never returns a gRPC error for a request it
// can read: Envoy would apply its failure mode instead of capsnap's answer.
func (s *Server) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	var span trace.Span
	if s.tracer != nil {
		_, span = s.tracer.Start(tracing.Incoming(ctx), "capsnap.check", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
	}
	attrs := req.GetAttributes()
	h := attrs.GetRequest().GetHttp()
	body := h.GetRawBody()
	if len(body) == 0 && h.GetBody() != "" {
		body = []byte(h.GetBody())
	}
	out := s.core.Decide(&decide.Request{
		Method:  h.GetMethod(),
		Headers: h.GetHeaders(),
		Body:    body,
		// Envoy marks a body it cut at max_request_bytes.
		Truncated: h.GetHeaders()["x-envoy-auth-partial-body"] == "true",
		ServerID:  attrs.GetContextExtensions()[ServerIDKey],
		Peer:      attrs.GetSource().GetPrincipal(),
		Metadata:  attrs.GetMetadataContext().GetFilterMetadata(),
	})
	if span != nil {
		decisionSpan(span, &out)
	}
	return response(&out, &s.pins), nil
}
