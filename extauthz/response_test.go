package extauthz

import (
	"testing"
	"time"

	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/policy"
)

// An allowed call's answer is one allocation, with every header it can
// carry (the pin's shared, once made) and its metadata (always the same);
// a listing's also has its expiry's text and its metadata. Every allowed
// request makes one.
func TestAllowedAnswerAllocs(t *testing.T) {
	validUntil := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	call := &decide.Outcome{Tool: "refund", ServerID: "billing", Principal: "agent", SchemaDigest: "sha256:1", PolicyDigest: "sha256:2",
		Effect: policy.EffectClass(1), Epoch: "ep_1", ValidUntil: validUntil, Envelope: "e.n.v", Grant: "g.r.a.n.t"}
	listing := &decide.Outcome{ServerID: "billing", Principal: "agent", Epoch: "ep_1", ValidUntil: validUntil}
	var pins pinHeaders
	for _, tt := range []struct {
		name string
		o    *decide.Outcome
		max  float64
		// headers are the answer's, to the upstream or the client.
		headers int
	}{
		{"a call with an envelope under a grant", call, 1, pinHeaderCount + 4},
		{"a listing", listing, 3, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ok := response(tt.o, &pins).GetOkResponse()
			if n := len(ok.GetHeaders()) + len(ok.GetResponseHeadersToAdd()); n != tt.headers {
				t.Fatalf("%d headers, want %d", n, tt.headers)
			}
			if n := testing.AllocsPerRun(100, func() { response(tt.o, &pins) }); n > tt.max {
				t.Errorf("%.0f allocations an answer, want at most %.0f", n, tt.max)
			}
		})
	}
}
