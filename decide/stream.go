package decide

import (
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/mcpparse"
)

// Screened is the decision on content of an answer that is not a
// tools/list's own.
type Screened struct {
	// Content goes on in content's place: content itself, byte for byte,
	// when nothing in it is withheld.
	Content []byte
	// Withheld counts what was withheld: each listing, or the answer.
	Withheld int
	// Whole says the answer is withheld whole: Content is then the
	// JSON-RPC error that answers in its place, as application/json with
	// HTTP status 502, wherever the adapter can still set the headers.
	Whole bool
	// Observed says the server is in observe mode: nothing is withheld,
	// what would have been is counted in Withheld, and the answer passes
	// as it was sent (after Oversized, the rest of it unscreened).
	Observed bool
}

// Screen is the response path of every answer that is not a tools/list's
// own: a tools/call's, the GET event stream, a stream resumed with
// Last-Event-ID, a batch's. A client takes any response on any stream for
// the answer to its pending request of the same id, so a server could
// deliver a listing on one of them that no ticket binds and no snapshot
// pins. content is whole content of such an answer, as the adapter reads
// it by the answer's framing (mcpparse.FramingOf): a JSON body whole,
// whole events of an event stream, any other body whole.
//
// Screen reads content as every client would, or withholds it. Each
// listing in a JSON body or an event is replaced by a JSON-RPC error for
// its id (listing_unbound). A body of any other framing (JSON and event
// streams that clients read differently, another charset, a type no
// client names) is withheld whole (malformed_response) if any client's
// reading of it could name tools, and passes byte for byte otherwise, as
// an HTML 502 or a plain-text error page does. Every withholding is
// audited and counted; an adapter counts an answer that passes whole
// with Passed.
//
// On a server in config.ModeObserve, what would be withheld is audited and
// counted, and the content passes as the server sent it.
func (s *Server) Screen(serverID string, head ResponseHead, content []byte) Screened {
	out := s.screen(serverID, head, content)
	if s.observe[serverID] {
		return Screened{Content: content, Withheld: out.Withheld, Observed: true}
	}
	return out
}

func (s *Server) screen(serverID string, head ResponseHead, content []byte) Screened {
	withheld := 0
	unbound := func(id []byte) []byte {
		withheld++
		return s.withholdAnswer(serverID, id, deny.Errorf(deny.ListingUnbound,
			"a tools/list result came on a stream that is not its own request's answer: capsnap cannot pin what it would deliver; list tools again"))
	}
	framing := mcpparse.FramingOf(head.ContentType)
	var out []byte
	switch {
	case mcpparse.Encoded(head.ContentEncoding):
		return s.withheldWhole(serverID, head.ID, deny.Errorf(deny.MalformedResponse,
			"a %s-encoded answer, which a client decompresses and could read a tools/list result in: capsnap never guesses at what a decompressor would deliver", head.ContentEncoding))
	case framing == mcpparse.FramingSSE:
		out = mcpparse.WithholdEventListings(content, s.limits.MaxDepth, unbound)
	case framing == mcpparse.FramingJSON:
		out = mcpparse.WithholdListings(content, s.limits.MaxDepth, unbound)
	case mcpparse.OtherMayName(head.ContentType, content, "tools"):
		return s.withheldWhole(serverID, head.ID, deny.Errorf(deny.MalformedResponse,
			"an answer of Content-Type %q, which MCP clients read differently (as JSON, as an event stream, in another charset), could hold a tools/list result: it is withheld whole", head.ContentType))
	default:
		return Screened{Content: content}
	}
	if withheld == 0 {
		return Screened{Content: content}
	}
	return Screened{Content: out, Withheld: withheld}
}

// The results of capsnap_deliveries_total that are not audited: an answer
// that is not a tools/list's own, passed whole or cut off while held.
const (
	ResultScreened   = "screened"
	ResultUnfinished = "unfinished"
)

// Oversized withholds whole the event (or the body) of an answer that is
// not a tools/list's own which outgrew discovery.max_response_bytes before
// it ended: capsnap cannot screen what it cannot hold, and passes none of
// it. The error that takes its place, for the request's id (head.ID; null
// on a GET stream), is one event of the stream for an event stream, the
// body for a JSON one, and the whole answer (Whole) for any other framing.
func (s *Server) Oversized(serverID string, head ResponseHead) Screened {
	framing := mcpparse.FramingOf(head.ContentType)
	what := "an answer"
	if framing == mcpparse.FramingSSE {
		what = "an event"
	}
	body := s.withholdAnswer(serverID, head.ID, deny.Errorf(deny.MalformedResponse,
		"%s over discovery.max_response_bytes %d, which capsnap cannot screen whole: it is withheld, none of it passed", what, s.maxResponse))
	if s.observe[serverID] {
		// An observed server's answer passes unscreened; the withholding
		// is audited and counted, and the adapter passes the rest.
		return Screened{Withheld: 1, Observed: true}
	}
	switch framing {
	case mcpparse.FramingSSE:
		return Screened{Content: mcpparse.MessageEvent(body), Withheld: 1}
	case mcpparse.FramingJSON:
		return Screened{Content: body, Withheld: 1}
	}
	return Screened{Content: body, Withheld: 1, Whole: true}
}

// Passed counts an answer that is not a tools/list's own with nothing in
// it withheld: whole, it passed as the server sent it (result
// "screened"); not whole, it was cut off (by the client or the server)
// while capsnap held it back to screen it whole, and none of it passed
// ("unfinished"). With Screen's and Oversized's withholdings, every
// answer to a request capsnap decided is counted
// (capsnap_deliveries_total). Neither is audited: that would be a line
// for every call's answer, and nothing in it was decided.
func (s *Server) Passed(serverID string, whole bool) {
	switch {
	case s.metrics == nil:
	case whole:
		s.passed[s.serverLabel(serverID)].Inc()
	default:
		s.metrics.deliveries.WithLabelValues(s.serverLabel(serverID), ResultUnfinished).Inc()
	}
}

func (s *Server) withheldWhole(serverID string, id []byte, why *deny.Error) Screened {
	return Screened{Content: s.withholdAnswer(serverID, id, why), Withheld: 1, Whole: true}
}

// withholdAnswer audits and counts one withholding on the response path, and
// returns the JSON-RPC error for id (null if nil) that takes its place.
func (s *Server) withholdAnswer(serverID string, id []byte, why *deny.Error) []byte {
	start := s.now()
	d := &decision{now: start, phase: "response", id: id, observed: s.observe[serverID], Outcome: Outcome{
		Method: "tools/list", ServerID: serverID, Denial: why,
	}}
	s.recordDelivery(d, &Delivery{}, s.now().Sub(start))
	return d.errorJSON()
}
