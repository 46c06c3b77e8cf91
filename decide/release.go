package decide

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"time"

	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/policy"
)

// releaseTTL bounds how long after its Check a call's answer may give back
// what the call reserved: a tool that answers later keeps it.
const releaseTTL = 10 * time.Minute

// release is what an allowed call's Check hands its answer's response path
// (Settle), through Envoy's dynamic metadata, on a server whose failed
// calls give back what they reserved (config servers[].release_on_error):
// what was reserved, and which JSON-RPC id the answer answers.
type release struct {
	ServerID string               `json:"s"`
	ID       json.RawMessage      `json:"i"`
	Reserved []policy.Reservation `json:"r"`
	Expires  int64                `json:"e"`
}

// releaseKey derives the key release tickets are sealed with from the
// listing key, so that a listing ticket never opens as a release ticket,
// nor one as the other.
func releaseKey(listingKey []byte) []byte {
	mac := hmac.New(sha256.New, listingKey)
	mac.Write([]byte("capsnap release ticket"))
	return mac.Sum(nil)
}

// releaseTicket is the ticket of d, an allowed call that reserved, if its
// server gives back what a failed call reserved; "" otherwise.
func (s *Server) releaseTicket(d *decision) string {
	if len(d.reserved) == 0 || !s.releaseOnError[d.ServerID] {
		return ""
	}
	return sealWith(s.releaseKey, release{ServerID: d.ServerID, ID: d.id, Reserved: d.reserved, Expires: d.now.Add(releaseTTL).Unix()})
}

// Settle reads content, whole JSON-RPC content of the answer to the call
// whose Check issued ticket, for that call's response: if the response
// says the call failed (a JSON-RPC error, or a tool result with isError),
// what the call reserved is given back, audited and counted. It returns
// true once the response was found (or the ticket cannot be used): the
// caller stops looking.
func (s *Server) Settle(ticket string, head ResponseHead, content []byte) bool {
	var r release
	now := s.now()
	if err := openWith(s.releaseKey, "release", ticket, &r); err != nil || now.Unix() > r.Expires {
		return true
	}
	framing := mcpparse.FramingOf(head.ContentType)
	if framing == mcpparse.FramingOther {
		// Read as no client reads it alike: the reservation stands, the
		// safe direction.
		return true
	}
	answered, failed := mcpparse.Failed(content, framing == mcpparse.FramingSSE, r.ID, s.limits.MaxDepth)
	if !answered || !failed {
		return answered
	}
	d := &decision{now: now, phase: "response", id: r.ID, Outcome: Outcome{Method: "tools/call", ServerID: r.ServerID}}
	err := policy.Release(s.counters, r.Reserved)
	if s.metrics != nil && err == nil {
		for _, res := range r.Reserved {
			s.metrics.limits.WithLabelValues(res.Kind, res.Name, "released").Inc()
		}
	}
	s.audit(d, s.now().Sub(now), func(ev *zerolog.Event) *zerolog.Event {
		arr := zerolog.Arr()
		for _, res := range r.Reserved {
			arr = arr.Dict(zerolog.Dict().Str("kind", res.Kind).Str("name", res.Name).Float64("amount", float64(res.Amount)/policy.Units))
		}
		ev = ev.Array("released", arr)
		if err != nil {
			// The counter store could not take it back: the amount stays
			// taken, the safe direction.
			ev = ev.Str("release_error", err.Error())
		}
		return ev
	})
	return true
}
