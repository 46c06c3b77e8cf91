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
// it is screened, read as every client would read it (mcpparse.Framing):
// an event stream event by event as each one ends (progress and the GET
// stream's notifications stay timely), a JSON body whole, and a body of
// any other framing whole, with its headers, which wait for it: such an
// answer is either passed as the server sent it or withheld whole, an
// error in its place. Nothing is sent on before it is screened whole
// (decide.Server.Screen), and what cannot be held is withheld, never
// passed in part.
type screen struct {
	d       Decider
	server  string
	head    decide.ResponseHead
	framing mcpparse.Framing
	// release is the call's release ticket until its response is found
	// (decide.Server.Settle), "" once it is or when there is none.
	release string
	// held is what is not screened yet: the start of an unfinished event,
	// or the body so far.
	held []byte
	// deferred says the headers are not answered yet: they go with the
	// body of an answer decided whole.
	deferred bool
	// dropping says an event (or a JSON body) outgrew the bound: it is
	// withheld, its error already sent (an event) or in over (a body), and
	// its bytes are dropped until it ends; line follows the line an event
	// being dropped is in.
	dropping bool
	over     []byte
	line     eventLine
	// passing says everything passes as it comes: an answer of a server
	// in observe mode that outgrew the bound.
	passing bool
	// screened is how much of a body of another framing was held when it
	// was last screened.
	screened int
	// withheld says something of the answer was withheld (or, observed,
	// would have been), and counted; ended that the answer ended; counted
	// that the answer has been counted either way.
	withheld, ended, counted bool
}

// screenHeaders answers the headers of an answer that is not a tools/list's
// own. They pass unchanged (capsnap's own denials come this way too, with
// their x-capsnap-reason), but a compressed body is refused whole: a client
// decompresses it, and capsnap never guesses at what it would read. body
// says a body follows, and duplex that Envoy streams it in full duplex:
// the screen returned then reads it, and the headers of a body decided
// whole wait for it (no answer now).
func (s *Server) screenHeaders(head decide.ResponseHead, server, release string, body, duplex bool) (*screen, *extprocv3.ProcessingResponse) {
	if !body {
		s.decider.Passed(server, true)
		return nil, passedHeaders()
	}
	if !duplex {
		// Buffered: screenBody screens the body whole, a compressed one
		// included.
		return nil, passedHeaders()
	}
	if mcpparse.Encoded(head.ContentEncoding) {
		r := s.decider.Screen(server, head, nil)
		if r.Whole {
			return nil, refusal(r.Content, "capsnap_malformed_response")
		}
		// Observed: it passes as it was sent, unscreened, and was
		// counted.
		return &screen{d: s.decider, server: server, head: head, passing: true, counted: true}, passedHeaders()
	}
	sc := &screen{d: s.decider, server: server, head: head, release: release, framing: mcpparse.FramingOf(head.ContentType)}
	if sc.framing == mcpparse.FramingOther {
		sc.deferred = true
		return sc, nil
	}
	return sc, passedHeaders()
}

func passedHeaders() *extprocv3.ProcessingResponse { return headersPassed }

// headersPassed is shared by every answer whose headers pass unchanged:
// it is never modified, and marshalling only reads it.
var headersPassed = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}

// refusal puts body, a JSON-RPC error, in a response's place.
func refusal(body []byte, details string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode_BadGateway},
		Headers: &extprocv3.HeaderMutation{SetHeaders: headers([][2]string{{"content-type", "application/json"}})},
		Body:    body,
		Details: details,
	}}}
}

// screenBody answers the body of an answer that is not a tools/list's own
// that Envoy buffered whole: screened at once, a changed one with its new
// length, one withheld whole answered by the error in its place.
func (s *Server) screenBody(head decide.ResponseHead, server, release string, body []byte, end bool) ([]*extprocv3.ProcessingResponse, bool, error) {
	if !end {
		// In parts that each want an answer (STREAMED): none can be held
		// back until it is screened whole.
		return nil, false, status.Error(codes.FailedPrecondition, "extproc: a response came in parts: Envoy's ext_proc response_body_mode must be FULL_DUPLEX_STREAMED or BUFFERED")
	}
	var r decide.Screened
	if len(body) > s.decider.MaxResponseBytes() {
		if r = s.decider.Oversized(server, head); !r.Observed {
			return []*extprocv3.ProcessingResponse{refusal(r.Content, "capsnap_malformed_response")}, true, nil
		}
		r.Content = body
	} else {
		if release != "" {
			s.decider.Settle(release, head, body)
		}
		r = s.decider.Screen(server, head, body)
	}
	if r.Whole {
		return []*extprocv3.ProcessingResponse{refusal(r.Content, "capsnap_malformed_response")}, true, nil
	}
	if r.Withheld == 0 {
		s.decider.Passed(server, true)
	}
	common := &extprocv3.CommonResponse{}
	if !bytes.Equal(r.Content, body) {
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: r.Content}}
		common.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: headers([][2]string{{"content-length", strconv.Itoa(len(r.Content))}})}
	}
	return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: common}}}}, false, nil
}

// feed takes the next chunk of the body (end: the last, and trailers: the
// trailers that follow it end it) and answers it: what of the answer may
// pass on now, or, when the answer is withheld whole, the error in its
// place, which ends the stream (last).
func (sc *screen) feed(chunk []byte, end, trailers bool) (resps []*extprocv3.ProcessingResponse, last bool) {
	out, whole := sc.read(chunk, end)
	if whole != nil {
		sc.count()
		if sc.deferred {
			return []*extprocv3.ProcessingResponse{refusal(whole, "capsnap_malformed_response")}, true
		}
		// The headers have gone: the error takes the body's place.
		out, end = whole, true
	}
	if sc.deferred {
		if !end && !sc.passing {
			return nil, false
		}
		sc.deferred = false
		resps = append(resps, passedHeaders())
	}
	if end {
		sc.ended = true
		sc.count()
	}
	return append(resps, streamedBody(out, end && !trailers)...), false
}

// count counts the answer once: as passed when nothing of it was withheld
// (each withholding was counted as it was made), or, cut off before its
// end while it was held back whole (a JSON body, another framing), as
// unfinished. An event stream cut off passed what it had screened.
func (sc *screen) count() {
	if sc.counted {
		return
	}
	sc.counted = true
	if !sc.withheld {
		sc.d.Passed(sc.server, sc.ended || sc.framing == mcpparse.FramingSSE)
	}
}

// read screens chunk, the next of the body, and returns what may pass on,
// or the error that takes the whole answer's place.
func (sc *screen) read(chunk []byte, end bool) (out, whole []byte) {
	switch {
	case sc.passing:
		return chunk, nil
	case sc.framing == mcpparse.FramingSSE:
		return sc.readEvents(chunk, end), nil
	}
	return sc.readWhole(chunk, end)
}

// readWhole holds a JSON body, or a body of any other framing, until it
// ends, and screens it whole. One that outgrows the bound is withheld
// whole: a JSON body by the error that takes its place once it ends (its
// headers have gone), any other at once.
func (sc *screen) readWhole(chunk []byte, end bool) (out, whole []byte) {
	if sc.dropping {
		if end {
			return sc.over, nil
		}
		return nil, nil
	}
	if len(sc.held) == 0 && end && len(chunk) <= sc.d.MaxResponseBytes() {
		// The whole body in one chunk, as most answers come: screened
		// where it lies.
		sc.held = chunk
	} else {
		sc.held = append(sc.held, chunk...)
	}
	if len(sc.held) > sc.d.MaxResponseBytes() {
		r := sc.d.Oversized(sc.server, sc.head)
		sc.withheld = true
		if r.Observed {
			sc.passing, out, sc.held = true, sc.held, nil
			return out, nil
		}
		sc.held = nil
		if r.Whole {
			return nil, r.Content
		}
		sc.dropping, sc.over = true, r.Content
		if end {
			return sc.over, nil
		}
		return nil, nil
	}
	if !end {
		// What is held so far of another framing could name tools for
		// some client already: withheld now, not when the answer ends (a
		// GET stream never does). A body that could not still may, once
		// more of it comes; it is screened again each time it has
		// doubled, so that a body in many small chunks costs no more
		// than twice its screening, and nothing of it passes meanwhile.
		if sc.framing != mcpparse.FramingOther || len(sc.held) < 2*sc.screened {
			return nil, nil
		}
		sc.screened = len(sc.held)
		switch r := sc.d.Screen(sc.server, sc.head, sc.held); {
		case r.Whole:
			sc.withheld, sc.held = true, nil
			return nil, r.Content
		case r.Observed && r.Withheld > 0:
			// Counted once: the rest passes as it comes.
			sc.withheld, sc.passing, out, sc.held = true, true, sc.held, nil
			return out, nil
		}
		return nil, nil
	}
	content := sc.held
	sc.held = nil
	sc.settle(content)
	r := sc.d.Screen(sc.server, sc.head, content)
	sc.withheld = sc.withheld || r.Withheld > 0
	if r.Whole {
		return nil, r.Content
	}
	return r.Content, nil
}

// readEvents screens an event stream event by event, as each one ends.
// An event over the bound is withheld whole, an error event in its place:
// at once when it outgrows the bound before it ends, its bytes then
// dropped until the blank line that ends it; and so is one that came
// whole in one chunk, so that what passes does not hang on how Envoy cut
// the stream.
func (sc *screen) readEvents(chunk []byte, end bool) []byte {
	var out []byte
	max := sc.d.MaxResponseBytes()
	for {
		if sc.dropping {
			n, ok := sc.line.end(chunk)
			if !ok {
				return out
			}
			sc.dropping, chunk = false, chunk[n:]
		}
		n, ok := sc.line.end(chunk)
		if !ok {
			sc.held = append(sc.held, chunk...)
			switch {
			case len(sc.held) > max:
				r := sc.d.Oversized(sc.server, sc.head)
				sc.withheld = true
				if r.Observed {
					sc.passing = true
					return append(out, sc.held...)
				}
				sc.dropping, sc.held = true, nil
				out = append(out, r.Content...)
			case end && len(sc.held) > 0:
				// The stream ended inside an event.
				out = append(out, sc.screenEvents(sc.held)...)
				sc.held = nil
			}
			return out
		}
		event := append(sc.held, chunk[:n]...)
		sc.held, chunk = nil, chunk[n:]
		if len(event) > max {
			r := sc.d.Oversized(sc.server, sc.head)
			sc.withheld = true
			if r.Observed {
				out = append(out, event...)
				continue
			}
			out = append(out, r.Content...)
			continue
		}
		out = append(out, sc.screenEvents(event)...)
	}
}

// screenEvents screens whole events.
func (sc *screen) screenEvents(events []byte) []byte {
	sc.settle(events)
	r := sc.d.Screen(sc.server, sc.head, events)
	sc.withheld = sc.withheld || r.Withheld > 0
	return r.Content
}

// settle hands content, as the server sent it, to Settle until the call's
// response is found in it.
func (sc *screen) settle(content []byte) {
	if sc.release != "" && sc.d.Settle(sc.release, sc.head, content) {
		sc.release = ""
	}
}

// eventLine follows the line an event-stream reader is in, byte by byte,
// to find the blank line that ends an event where mcpparse.CompleteEvents
// would: a LF that ends a line that is empty or a lone CR.
type eventLine struct {
	// n is how many bytes the line has so far, up to 2; cr says the one
	// it has is a CR.
	n  int
	cr bool
}

// end reads b and returns how much of it runs through the end of the
// event, if it ends in b.
func (l *eventLine) end(b []byte) (int, bool) {
	for i, c := range b {
		switch {
		case c == '\n':
			blank := l.n == 0 || (l.n == 1 && l.cr)
			*l = eventLine{}
			if blank {
				return i + 1, true
			}
		case l.n == 0 && c == '\r':
			l.n, l.cr = 1, true
		default:
			l.n, l.cr = min(l.n+1, 2), false
		}
	}
	return 0, false
}
