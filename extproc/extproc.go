// Package extproc is capsnap's Envoy external-processing service
// (envoy.service.ext_proc.v3.ExternalProcessor) for every answer to a
// request capsnap checked. The answer to a tools/list capsnap allowed,
// whose Check left a listing ticket in the ext_authz filter's dynamic
// metadata, goes whole to the decision (decide.Server.Deliver), which
// mints the snapshot over exactly what the agent is delivered; Envoy gets
// the response rewritten to exactly the pinned tools and the snapshot's
// epoch, or a JSON-RPC error in its place. Every other answer goes to
// decide.Server.Screen as it streams (screen.go), which withholds a
// listing on a stream not its own. It holds no decision of its own.
//
// Envoy sends it the response headers and the body either streamed in full
// duplex (FULL_DUPLEX_STREAMED, envoy/*.yaml: for a listing the headers'
// answer waits for the last chunk, one exchange for the whole response; any
// other answer passes on event by event) or buffered whole by Envoy
// (BUFFERED: two exchanges, headers then body, and no answer that never
// ends, such as the GET event stream, can be screened). The request side
// is let through unchanged.
package extproc

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	grpcmd "google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/tracing"
)

// MetadataNamespace is where Envoy keeps the ext_authz filter's dynamic
// metadata, which carries the listing ticket of the Check that allowed the
// tools/list; the ext_proc filter must forward it
// (metadata_options.forwarding_namespaces.untyped).
const MetadataNamespace = "envoy.filters.http.ext_authz"

// ListingMetadata is the gRPC metadata key under which Envoy opens an
// ext_proc stream with the listing ticket of the Check that allowed a
// tools/list (grpc_service.initial_metadata, from the ext_authz filter's
// dynamic metadata; envoy/demo.yaml). Envoy opens the stream when the
// response's headers reach the filter, and may end it before it sends a
// message, when the server resets the answer at once: the ticket is then
// known only from here, and the listing is reported as aborted, not as a
// missing response path.
const ListingMetadata = "x-capsnap-listing"

// Decider decides a response: the decision core's response half,
// decide.Server.Deliver for a tools/list's own answer and Screen for
// every other, and the most of a response it reads whole.
type Decider interface {
	Deliver(ticket string, head decide.ResponseHead, body []byte) *decide.Delivery
	Aborted(ticket string, head decide.ResponseHead)
	Screen(serverID string, head decide.ResponseHead, content []byte) decide.Screened
	Oversized(serverID string, head decide.ResponseHead) decide.Screened
	Passed(serverID string, whole bool)
	Settle(ticket string, head decide.ResponseHead, content []byte) bool
	Elicits(session string)
	MaxResponseBytes() int
}

var _ Decider = (*decide.Server)(nil)

// Server implements extprocv3.ExternalProcessorServer.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	decider Decider
	// tracer, if set, makes a span of each delivery decision.
	tracer trace.Tracer
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// New returns a Server that hands each response to d, and, with a tracer,
// makes a span of each tools/list delivery in the trace Envoy started.
func New(d Decider, tracer trace.Tracer) *Server { return &Server{decider: d, tracer: tracer} }

// Process serves one HTTP request's stream of processing messages.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	var (
		head decide.ResponseHead
		// duplex says Envoy streams the body in full duplex, and body
		// collects its chunks until the last.
		duplex bool
		body   []byte
		// ticket is the listing ticket of a tools/list's own answer, and
		// server the route's server_id, from the Check's metadata; sc
		// screens any other answer streamed in full duplex.
		ticket, server string
		// release is the release ticket of an allowed call whose answer
		// may give back what it reserved (decide.Server.Settle).
		release string
		// elicits says the Check let through an initialize whose client
		// takes URL elicitations, which its answer's session then does.
		elicits bool
		// id is the JSON-RPC id of the request the answer is to, which
		// an error written in its place answers (decide.ResponseHead.ID).
		id json.RawMessage
		sc *screen
		// answered says a tools/list's own answer came back through the
		// response path, and delivered that its body reached Deliver;
		// headed that any answer's headers came.
		answered, delivered, headed bool
	)
	// The ticket Envoy opened the stream with, if any: "-" is what its
	// formatter makes of a listing ticket the Check did not leave.
	var opened string
	if v := grpcmd.ValueFromIncomingContext(stream.Context(), ListingMetadata); len(v) == 1 && v[0] != "-" {
		opened = v[0]
	}
	defer func() {
		// However the stream ends: an answer cut off (a GET stream the
		// client left) is counted too, and a listing whose upstream
		// aborted it is reported as that, not as a missing response path.
		if sc != nil {
			sc.count()
		}
		switch {
		case delivered:
		case ticket != "" && answered:
			s.decider.Aborted(ticket, head)
		case ticket == "" && opened != "" && !headed:
			// Ended before Envoy sent the headers. Headers that came
			// without the ticket are an answer the response path took
			// for another's: Envoy forwards no metadata, which the
			// unbound count is there to show.
			s.decider.Aborted(opened, head)
		}
	}()
	for {
		req, err := stream.Recv()
		// Envoy ends a stream by cancelling it once it has the last answer
		// it needs.
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return err
		}
		if pc := req.GetProtocolConfig(); pc != nil {
			// Envoy says on a stream's first message how it sends bodies.
			duplex = pc.GetResponseBodyMode() == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		if md := req.GetMetadataContext().GetFilterMetadata()[MetadataNamespace]; md != nil {
			ticket = md.GetFields()["listing"].GetStringValue()
			server = md.GetFields()["server_id"].GetStringValue()
			release = md.GetFields()["release"].GetStringValue()
			elicits = md.GetFields()["elicitation"].GetStringValue() == "url"
			id = requestID(md.GetFields()["jsonrpc_id"].GetStringValue())
		}
		// resps answer req; last says they end the stream.
		var (
			resps []*extprocv3.ProcessingResponse
			last  bool
		)
		switch r := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}})
		case *extprocv3.ProcessingRequest_RequestBody:
			resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}})
		case *extprocv3.ProcessingRequest_RequestTrailers:
			resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			head, headed = responseHead(r.ResponseHeaders.GetHeaders()), true
			head.ID = id
			if elicits && head.Status/100 == 2 {
				s.decider.Elicits(head.Session)
			}
			if ticket == "" {
				var resp *extprocv3.ProcessingResponse
				if sc, resp = s.screenHeaders(head, server, release, !r.ResponseHeaders.GetEndOfStream(), duplex); resp != nil {
					resps, last = append(resps, resp), resp.GetImmediateResponse() != nil
				}
				break
			}
			// The answer came back through the response path: whatever
			// happens to it now, it is not an unbound listing.
			answered = true
			switch {
			case r.ResponseHeaders.GetEndOfStream():
				// No body follows: nothing is delivered, so nothing is
				// pinned, and the caller hears whatever the status says.
				resps, delivered = append(resps, s.decide(stream.Context(), req, head, nil, false)), true
			case duplex:
				// Answered with the body, whose last chunk says which
				// snapshot the headers name.
			default:
				resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
			}
		case *extprocv3.ProcessingRequest_ResponseBody:
			chunk, end := r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream()
			if ticket == "" {
				if sc != nil {
					resps, last = sc.feed(chunk, end, false)
				} else if resps, last, err = s.screenBody(head, server, release, chunk, end); err != nil {
					return err
				}
				break
			}
			if !duplex {
				if !end {
					// Only a whole response can be read and rewritten;
					// a streamed mode but full duplex is a
					// misconfiguration, and fails closed.
					head.Streamed = true
				}
				resps, delivered = append(resps, s.decide(stream.Context(), req, head, chunk, true)), true
				break
			}
			body = append(body, chunk...)
			over := len(body) > s.decider.MaxResponseBytes()
			if !over && !end {
				break
			}
			var refused bool
			resps, refused = s.decideDuplex(stream.Context(), req, head, body, false)
			delivered = true
			if over && !refused {
				// Never part of a response as if it were the whole:
				// Envoy answers status_on_error instead.
				return status.Error(codes.Internal, "extproc: a tools/list response over the bound was not refused")
			}
			// Read no further past the bound.
			last = over
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			if sc != nil {
				// The body ended with the trailers that follow it.
				resps, last = sc.feed(nil, true, true)
			}
			if duplex && ticket != "" {
				// The body ended with the trailers that follow it; a
				// refusal answers them too.
				resps, last = s.decideDuplex(stream.Context(), req, head, body, true)
				delivered = true
			}
			if !last {
				resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
			}
		}
		for _, r := range resps {
			if err := stream.Send(r); err != nil {
				return err
			}
		}
		if last {
			return nil
		}
	}
}

// deliver hands a whole response to the decider, under the listing ticket
// the Check left in the ext_authz filter's metadata.
func (s *Server) deliver(ctx context.Context, req *extprocv3.ProcessingRequest, head decide.ResponseHead, body []byte) *decide.Delivery {
	ticket := req.GetMetadataContext().GetFilterMetadata()[MetadataNamespace].GetFields()["listing"].GetStringValue()
	if s.tracer == nil {
		return s.decider.Deliver(ticket, head, body)
	}
	_, span := s.tracer.Start(tracing.Incoming(ctx), "tools/list delivery", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	out := s.decider.Deliver(ticket, head, body)
	deliverySpan(span, out)
	return out
}

// decide hands a whole response to the decider and turns its decision into
// Envoy's answer: the rewritten body with the snapshot's headers, or an
// immediate response with the JSON-RPC error in the response's place.
// atBody says which message is answered: Envoy takes an answer of the
// other kind as a protocol error.
func (s *Server) decide(ctx context.Context, req *extprocv3.ProcessingRequest, head decide.ResponseHead, body []byte, atBody bool) *extprocv3.ProcessingResponse {
	out := s.deliver(ctx, req, head, body)
	if out.Fail != nil {
		return replaced(out)
	}
	common := headerMutation(head, out)
	if out.Body != nil {
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out.Body}}
		common.HeaderMutation.SetHeaders = append(common.HeaderMutation.SetHeaders, headers([][2]string{{"content-length", strconv.Itoa(len(out.Body))}})...)
	}
	if !atBody {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: common}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: common}}}
}

// decideDuplex hands a response streamed in full duplex to the decider:
// the headers' answer, with the snapshot's headers, then the body's, the
// whole body (ending the stream unless trailers follow); or, refused, the
// JSON-RPC error in the response's place, which answers the whole stream.
func (s *Server) decideDuplex(ctx context.Context, req *extprocv3.ProcessingRequest, head decide.ResponseHead, body []byte, trailers bool) (_ []*extprocv3.ProcessingResponse, refused bool) {
	out := s.deliver(ctx, req, head, body)
	if out.Fail != nil {
		return []*extprocv3.ProcessingResponse{replaced(out)}, true
	}
	if out.Body != nil {
		body = out.Body
	}
	// Envoy drops the content-length of a body streamed in full duplex,
	// and sends the body chunked.
	resps := []*extprocv3.ProcessingResponse{
		{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: headerMutation(head, out)}}},
	}
	return append(resps, streamedBody(body, !trailers)...), false
}

// streamedBody is body sent on in full duplex: in chunks of at most 64
// KiB, as ext_proc's API asks of a streamed body, every one a streamed
// response, which is all Envoy takes in this mode; the last ends the
// stream if end says so. An empty body that does not end it needs no
// response.
func streamedBody(body []byte, end bool) []*extprocv3.ProcessingResponse {
	var resps []*extprocv3.ProcessingResponse
	for len(body) > 0 || end {
		n := min(len(body), maxChunk)
		last := n == len(body)
		resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
			BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body[:n], EndOfStream: last && end},
			}},
		}}}})
		if last {
			break
		}
		body = body[n:]
	}
	return resps
}

// maxChunk is the most of a body one streamed response carries.
const maxChunk = 64 << 10

// replaced is the answer that puts a refusal's JSON-RPC error, status and
// headers in the response's place.
func replaced(out *decide.Delivery) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(out.Status)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: headers(out.Headers)},
		Body:    out.Body,
		Details: "capsnap_" + string(out.Fail.Reason),
	}}}
}

// headerMutation sets a delivery's headers and strips the server's own
// x-capsnap-* headers, which never reach the agent: only capsnap says
// which snapshot a list was pinned under.
func headerMutation(head decide.ResponseHead, out *decide.Delivery) *extprocv3.CommonResponse {
	return &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
		SetHeaders:    headers(out.Headers),
		RemoveHeaders: head.CapsnapHeaders,
	}}
}

// responseHead reads what the decision needs of the response's headers.
// Envoy sends each value as raw bytes (raw_value) or, in older versions, as
// a string (value).
func responseHead(hm *corev3.HeaderMap) decide.ResponseHead {
	var h decide.ResponseHead
	var ct, ce bool // seen
	// Only the values read are copied out of the message.
	value := func(kv *corev3.HeaderValue) string {
		if v := kv.GetRawValue(); len(v) > 0 {
			return string(v)
		}
		return kv.GetValue()
	}
	for _, kv := range hm.GetHeaders() {
		switch k := strings.ToLower(kv.GetKey()); k {
		case ":status":
			h.Status, _ = strconv.Atoi(value(kv))
		// A header sent twice is read as the Fetch API reads it, joined
		// by ", ": capsnap must read the framing a client reads.
		case "content-type":
			h.ContentType = joined(h.ContentType, value(kv), ct)
			ct = true
		case "content-encoding":
			h.ContentEncoding = joined(h.ContentEncoding, value(kv), ce)
			ce = true
		case "mcp-session-id":
			h.Session = value(kv)
		default:
			if strings.HasPrefix(k, decide.HeaderPrefix) {
				h.CapsnapHeaders = append(h.CapsnapHeaders, k)
			}
		}
	}
	return h
}

// joined is a header's value v after the value it already had, if seen.
func joined(had, v string, seen bool) string {
	if !seen {
		return v
	}
	return had + ", " + v
}

func headers(kv [][2]string) []*corev3.HeaderValueOption {
	out := make([]*corev3.HeaderValueOption, len(kv))
	for i, h := range kv {
		out[i] = &corev3.HeaderValueOption{
			Header:       &corev3.HeaderValue{Key: h[0], RawValue: []byte(h[1])},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}
	}
	return out
}

// deliverySpan sets span's attributes for the delivery out: the
// decision, its reason, how many tools were withheld and the epoch of the
// snapshot minted.
func deliverySpan(span trace.Span, out *decide.Delivery) {
	decision, reason := "allow", "ok"
	if out.Fail != nil {
		decision, reason = "deny", string(out.Fail.Reason)
		span.SetAttributes(attribute.String("error.type", reason))
	}
	span.SetAttributes(
		attribute.String("mcp.method.name", "tools/list"),
		attribute.String("capsnap.decision", decision),
		attribute.String("capsnap.reason", reason),
		attribute.Int("capsnap.tools_withheld", len(out.Withheld)),
	)
	for _, h := range out.Headers {
		if h[0] == decide.HeaderEpoch {
			span.SetAttributes(attribute.String("capsnap.epoch", h[1]))
		}
	}
}

// requestID is the JSON-RPC id the Check left in the metadata, if it is
// one (a number or a string): what Envoy forwards is capsnap's own, but a
// value that is not an id is not written into an answer.
func requestID(v string) json.RawMessage {
	if v == "" || !json.Valid([]byte(v)) || (v[0] != '"' && v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return nil
	}
	return json.RawMessage(v)
}
