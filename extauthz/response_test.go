package extauthz

import (
	"testing"
	"time"

	"github.com/capsnap/capsnap/cache"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/policy"
)

// An allowed call's answer is one allocation, with every header it can
// carry (the pin's shared, once made) and its metadata (always the same);
// a listing's also has its expiry's text and its metadata. Every allowed
// request makes one.
func TestAllowedAnswerAllocs(t *testing.T) {
	snap := &cache.Snapshot{Epoch: "ep_1", ValidUntil: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)}
	call := &decision{tool: "refund", serverID: "billing", principal: "agent", digest: "sha256:1", policyDigest: "sha256:2",
		effect: policy.EffectClass(1), snapshot: snap, envelope: "e.n.v", grant: "g.r.a.n.t"}
	listing := &decision{serverID: "billing", principal: "agent", snapshot: snap}
	var pins pinHeaders
	form := config.Default().Denials
	for _, tt := range []struct {
		name string
		d    *decision
		max  float64
		// headers are the answer's, to the upstream or the client.
		headers int
	}{
		{"a call with an envelope under a grant", call, 1, pinHeaderCount + 4},
		{"a listing", listing, 3, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ok := tt.d.response(&pins, form).GetOkResponse()
			if n := len(ok.GetHeaders()) + len(ok.GetResponseHeadersToAdd()); n != tt.headers {
				t.Fatalf("%d headers, want %d", n, tt.headers)
			}
			if n := testing.AllocsPerRun(100, func() { tt.d.response(&pins, form) }); n > tt.max {
				t.Errorf("%.0f allocations an answer, want at most %.0f", n, tt.max)
			}
		})
	}
}
