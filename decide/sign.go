// The signed envelope of an allowed call, and the grants it comes under.

package decide

import (
	"strings"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/internal/bounded"
)

// signEnvelope signs the envelope of an allowed call, binding it to exactly what
// was verified: the handler that runs it can check each part against
// itself before any side effect. For a server that holds a grant key, what
// is the same for every call of the tool under the snapshot is signed once,
// in its grant, and the call is bound by a MAC under the grant's call key.
func (s *Server) signEnvelope(d *decision) *deny.Error {
	if s.envelope == nil {
		return nil
	}
	args, err := envelope.ArgsDigest(d.call.Arguments)
	if err != nil {
		// mcpparse read these bytes as a JSON object.
		return deny.Errorf(deny.MalformedRequest, "arguments: %v", err)
	}
	exp := d.now.Add(s.envelopeTTL)
	if d.snapshot.ValidUntil.Before(exp) {
		exp = d.snapshot.ValidUntil
	}
	if r := s.recipients[d.ServerID]; r != nil {
		g, err := s.grant(d, r)
		if err != nil {
			return deny.Errorf(deny.EnvelopeFailed, "%v", err)
		}
		c := &envelope.CallClaims{IssuedAt: d.now.Unix(), Expiry: exp.Unix(), ArgsDigest: args, RequestID: d.id}
		token, err := g.Seal(c)
		if err != nil {
			return deny.Errorf(deny.EnvelopeFailed, "%v", err)
		}
		d.Envelope, d.envelopeID, d.Grant, d.grantID = token, c.ID, g.Token, g.Claims.ID
		return nil
	}
	c := &envelope.Claims{
		Audience: d.ServerID, Subject: d.Principal, IssuedAt: d.now.Unix(), Expiry: exp.Unix(),
		Epoch: d.snapshot.Epoch, Tool: d.Tool, SchemaDigest: d.SchemaDigest,
		EffectClass: d.Effect.String(), PolicyDigest: d.PolicyDigest, ArgsDigest: args, RequestID: d.id,
	}
	token, err := s.envelope.Seal(c)
	if err != nil {
		return deny.Errorf(deny.EnvelopeFailed, "%v", err)
	}
	d.Envelope, d.envelopeID = token, c.ID
	return nil
}

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
	g, err := s.mintGrant(want, r)
	if err != nil {
		return nil, err
	}
	s.grants.Store(grantKey{strings.Clone(k.serverID), strings.Clone(k.epoch), strings.Clone(k.tool)}, g, maxGrants)
	return g, nil
}
