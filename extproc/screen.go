package extproc

import (
	"bytes"
	"strconv"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/mcpparse"
)

// screen holds what is read of one answer that is not a tools/list's own
// while Envoy streams it in full duplex, so that it passes on as soon as
// it is known to carry no listing: an event stream event by event as each
// one ends (progress and the GET stream's notifications stay timely), a
// JSON body whole. What could carry a listing is never sent on before it
// is screened whole (decide.Server.Screen).
type screen struct {
	d      Decider
	server string
	head   decide.ResponseHead
	// release is the call's release ticket until its response is found
	// (decide.Server.Settle), "" once it is or when there is none.
	release string
	// messages says a client reads the body as JSON-RPC, sse as an event
	// stream; any other body passes as it comes.
	messages, sse bool
	// held is what is not screened yet: the start of an unfinished event,
	// or the JSON body so far.
	held []byte
	// passing is set once held outgrew the bound without naming tools:
	// from then on bytes pass as they come while they cannot name tools,
	// and tail is the last of them, where a name could begin.
	passing bool
	tail    []byte
}

// screenHeaders answers the headers of an answer that is not a tools/list's
// own: they pass unchanged (capsnap's own denials come this way too, with
// their x-capsnap-reason), but a body a client would read as JSON-RPC and
// capsnap cannot (compressed) is refused whole. It returns the screen for
// the body to come, when Envoy streams it in full duplex.
func (s *Server) screenHeaders(head decide.ResponseHead, server, release string, body bool) (*screen, *extprocv3.ProcessingResponse) {
	sse, messages := mcpparse.MessageMediaType(head.ContentType)
	if body && messages && mcpparse.Encoded(head.ContentEncoding) {
		return nil, refusal(s.decider.Screen(server, head, nil), "capsnap_listing_unbound")
	}
	resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	if !body {
		return nil, resp
	}
	return &screen{d: s.decider, server: server, head: head, release: release, messages: messages, sse: sse}, resp
}

// refusal puts body, a JSON-RPC error, in a response's place.
func refusal(body []byte, details string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode_BadGateway},
		Headers: &extprocv3.HeaderMutation{SetHeaders: headers([][2]string{{"content-type", "application/json"}})},
		Body:    body,
		Details: details,
	}}}
}

// screenBody answers a body chunk of an answer that is not a tools/list's
// own: in full duplex, what of it is screened so far; buffered, the whole
// body screened at once.
func (s *Server) screenBody(sc *screen, head decide.ResponseHead, server, release string, chunk []byte, end bool) ([]*extprocv3.ProcessingResponse, error) {
	if sc != nil {
		out, err := sc.feed(chunk, end)
		return streamedBody(out, end), err
	}
	if !end {
		// In parts that each want an answer (STREAMED): none can be held
		// back until it is screened whole.
		return nil, status.Error(codes.FailedPrecondition, "extproc: a response came in parts: Envoy's ext_proc response_body_mode must be FULL_DUPLEX_STREAMED or BUFFERED")
	}
	if release != "" {
		s.decider.Settle(release, head, chunk)
	}
	common := &extprocv3.CommonResponse{}
	if out := s.decider.Screen(server, head, chunk); !bytes.Equal(out, chunk) {
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}}
		common.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: headers([][2]string{{"content-length", strconv.Itoa(len(out))}})}
	}
	return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: common}}}}, nil
}

// tailBytes is how much of what passed is kept to find a name that begins
// in one chunk and ends in the next: "tools" in five runes of up to three
// bytes each (the Kelvin sign folds to k).
const tailBytes = 16

// feed takes the next chunk of the body (end: the last) and returns what
// may pass on now. An error ends the stream: held bytes that outgrew the
// bound and could name tools can neither pass nor be screened, and part of
// the body has gone on (or, passing, the rest would name tools): Envoy
// resets the stream, and what the client has is no whole message.
func (sc *screen) feed(chunk []byte, end bool) ([]byte, error) {
	if !sc.messages {
		return chunk, nil
	}
	if sc.passing {
		seen := append(sc.tail, chunk...)
		if mcpparse.MayName(seen, "tools") {
			return nil, status.Error(codes.PermissionDenied, "extproc: a response over discovery.max_response_bytes goes on to name tools: it is cut off, never passed unscreened")
		}
		// The last bytes of what passed, however short the chunks.
		sc.tail = append(sc.tail[:0], seen[max(len(seen)-tailBytes, 0):]...)
		return chunk, nil
	}
	sc.held = append(sc.held, chunk...)
	var out []byte
	switch {
	case end:
		sc.settle(sc.held)
		out, sc.held = sc.d.Screen(sc.server, sc.head, sc.held), nil
	case sc.sse:
		if n := mcpparse.CompleteEvents(sc.held); n > 0 {
			sc.settle(sc.held[:n])
			out = sc.d.Screen(sc.server, sc.head, sc.held[:n])
			sc.held = append([]byte(nil), sc.held[n:]...)
		}
	}
	if len(sc.held) > sc.d.MaxResponseBytes() {
		if mcpparse.MayName(sc.held, "tools") {
			return nil, status.Error(codes.PermissionDenied, "extproc: a response over discovery.max_response_bytes could name tools: it is cut off, never passed unscreened")
		}
		sc.passing = true
		out = append(out, sc.held...)
		sc.tail = append([]byte(nil), sc.held[len(sc.held)-tailBytes:]...)
		sc.held = nil
	}
	return out, nil
}

// settle hands content, as the server sent it, to Settle until the call's
// response is found in it.
func (sc *screen) settle(content []byte) {
	if sc.release != "" && sc.d.Settle(sc.release, sc.head, content) {
		sc.release = ""
	}
}
