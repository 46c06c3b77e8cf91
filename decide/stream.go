package decide

import (
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/mcpparse"
)

// Screen is the response path of every answer that is not a tools/list's
// own: a tools/call's, the GET event stream, a stream resumed with
// Last-Event-ID, a batch's. A client takes any response on any stream for
// the answer to its pending request of the same id, so a server could
// deliver a listing on one of them that no ticket binds and no snapshot
// pins. content is whole JSON-RPC content of such a response, as the
// adapter reads it: a JSON body, or whole events of an event stream.
// Screen returns it as it is, or with each listing in it withheld: replaced
// by a JSON-RPC error for its id, audited and counted (listing_unbound).
// Everything else (results, errors, the server's requests and
// notifications, a body no client reads as JSON-RPC) passes byte for byte.
// A compressed body a client would read as JSON-RPC cannot be screened, and
// is withheld whole, whatever content is.
//
// On a server in config.ModeObserve, what would be withheld is audited and
// counted, and the content passes as the server sent it.
func (s *Server) Screen(serverID string, head ResponseHead, content []byte) []byte {
	screened := s.screen(serverID, head, content)
	if s.observe[serverID] {
		return content
	}
	return screened
}

func (s *Server) screen(serverID string, head ResponseHead, content []byte) []byte {
	withhold := func(id []byte, why string) []byte {
		start := s.now()
		d := &decision{now: start, phase: "response", id: id, observed: s.observe[serverID], Outcome: Outcome{
			Method: "tools/list", ServerID: serverID,
			Denial: deny.Errorf(deny.ListingUnbound, "%s: capsnap cannot pin what it would deliver; list tools again", why),
		}}
		s.recordDelivery(d, &Delivery{}, s.now().Sub(start))
		return d.errorJSON()
	}
	unbound := func(id []byte) []byte {
		return withhold(id, "a tools/list result came on a stream that is not its own request's answer")
	}
	sse, messages := mcpparse.MessageMediaType(head.ContentType)
	switch {
	case !messages:
		return content
	case mcpparse.Encoded(head.ContentEncoding):
		return withhold(nil, "a "+head.ContentEncoding+"-encoded answer, which could hold a tools/list result capsnap cannot read")
	case sse:
		return mcpparse.WithholdEventListings(content, s.limits.MaxDepth, unbound)
	}
	return mcpparse.WithholdListings(content, s.limits.MaxDepth, unbound)
}
