// The signed envelope of an allowed call, and the grants it comes under.

package decide

import (
	"strings"

	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/internal/bounded"
)

// grants keeps each snapshot's grant for each tool called under it.
// Bounded like the pin headers: past maxGrants it starts over, and each
// grant in use is signed again.
type grants = bounded.Map[grantKey, *envelope.Grant]

type grantKey struct{ serverID, epoch, tool string }

const maxGrants = 16384

// grant returns the grant of d's tool under d's snapshot, minting it on
// first use. A grant says what was verified for every call under it, so one
// kept that says anything else (another principal, definition, policy or
// expiry under the same epoch, which a snapshot never has) is minted again.
func (s *Server) grant(d *decision, r *envelope.Recipient) (*envelope.Grant, error) {
	want := envelope.GrantClaims{
		Audience: d.ServerID, Subject: d.Principal, Expiry: d.snapshot.ValidUntil.Unix(),
		Epoch: d.snapshot.Epoch, Tool: d.Tool, SchemaDigest: d.SchemaDigest,
		EffectClass: d.Effect.String(), PolicyDigest: d.PolicyDigest,
	}
	k := grantKey{d.ServerID, d.snapshot.Epoch, d.Tool}
	if g, ok := s.grants.Load(k); ok && g.Says(want) {
		return g, nil
	}
	want.IssuedAt = d.now.Unix()
	g, err := s.signer.Grant(want, r)
	if err != nil {
		return nil, err
	}
	s.grants.Store(grantKey{strings.Clone(k.serverID), strings.Clone(k.epoch), strings.Clone(k.tool)}, g, maxGrants)
	return g, nil
}
