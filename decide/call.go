// One tools/call decided, top-down: the snapshot it is verified against;
// the contract (what is live is what the snapshot pins: the definition,
// the effect class, the rules); the rules (the arguments against the
// pinned inputSchema, then the policy's terms); the seal (the envelope);
// the record (what the terms take). Decide makes the answer of it.

package decide

import (
	"time"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// callTool decides the tools/call m. A denial decided on a newest-snapshot
// pointer that lagged the store is decided once more, on the store's own
// newest (lagged).
func (s *Server) callTool(d *decision, m *mcpparse.Message) *deny.Error {
	d.Method, d.id, d.Name, d.Tool, d.call = m.Method, m.ID, m.Tool, m.Tool, m
	// Kept whole, so that a denial decided again starts from it.
	called := *d
	fail := s.verifyCall(d)
	if fail == nil {
		return nil
	}
	newest := s.lagged(d, fail)
	if newest == nil {
		return fail
	}
	*d = called
	d.newest = newest
	return s.verifyCall(d)
}

// verifyCall holds one tools/call to its snapshot and to what is live now,
// in this order: the catalog is live; the snapshot exists and is the
// caller's; it has not expired; it pins the tool; the live definition is
// the pinned one; the live effect class is not stronger; the live policy
// rules are the pinned ones; then the arguments satisfy the pinned schema,
// the pinned constraints and sequence rules.
func (s *Server) verifyCall(d *decision) *deny.Error {
	list, catalogFail := s.live(d.ServerID, d.now)
	r := s.rules.Load()

	// Snapshot.
	snap, fail := s.snapshotFor(d)
	if fail != nil {
		if catalogFail != nil {
			return catalogFail
		}
		if fail.Reason == deny.NoSnapshot && d.clientEpoch == "" && s.withoutListing[d.ServerID] {
			return s.callWithoutListing(d, r, list)
		}
		return fail
	}
	d.snapshot = snap
	if snap.Principal != d.Principal {
		return deny.Errorf(deny.PrincipalMismatch, "snapshot %s was minted for another principal", snap.Epoch)
	}
	if snap.ServerID != d.ServerID {
		return deny.Errorf(deny.NoSnapshot, "snapshot %s is for server %q, not %q", snap.Epoch, snap.ServerID, d.ServerID)
	}
	if !d.now.Before(snap.ValidUntil) {
		return deny.Errorf(deny.SnapshotExpired, "snapshot %s expired at %s", snap.Epoch, snap.ValidUntil.UTC().Format(time.RFC3339))
	}
	pin, pinned := snap.Pin(d.Tool)
	if !pinned {
		return s.whyNotPinned(d, r, list, catalogFail)
	}
	d.SchemaDigest, d.Effect, d.PolicyDigest = pin.SchemaDigest, pin.Effect, pin.PolicyDigest
	if d.clientDigest != "" && d.clientDigest != pin.SchemaDigest {
		return deny.Errorf(deny.SchemaDrift, "the client planned against %s, the snapshot pins %s", d.clientDigest, pin.SchemaDigest)
	}
	if catalogFail != nil {
		return s.staleRead(d, r, pin, list, catalogFail)
	}

	// Contract. The snapshot (epoch) is the caller's (principal) for this
	// server and pins this tool; the last of the tuple is the live digest.
	live, ok := list.Tools[d.Tool]
	if !ok {
		return deny.Errorf(deny.SchemaDrift, "tool %q is gone from server %q", d.Tool, d.ServerID)
	}
	d.liveDigest = live.Digest
	if live.Digest != pin.SchemaDigest {
		drift := deny.Errorf(deny.SchemaDrift, "tool %q is now %s, the snapshot pins %s", d.Tool, live.Digest, pin.SchemaDigest)
		drift.Change = s.changeOf(d.ServerID, d.Tool, pin.SchemaDigest, live)
		return drift
	}
	// A definition that changed and changed back is still new evidence:
	// list_changed, seen by any replica, invalidated the pin.
	changed, err := s.snapshots.ChangedAt(d.ServerID, d.Tool)
	if err != nil {
		return storeFailed(err)
	}
	if changed > pin.Seq {
		return deny.Errorf(deny.SchemaDrift, "tool %q was redefined after snapshot %s was minted", d.Tool, snap.Epoch)
	}
	rule, fail := r.admit(r.Policy.For(d.Principal), d.ServerID, d.Tool, live.Digest)
	switch {
	case fail != nil && fail.Reason == deny.ToolUnapproved:
		return fail
	case fail != nil:
		return deny.Errorf(deny.PolicyDrift, "the policy no longer allows it: %v", fail)
	}
	if rule.Effect > pin.Effect {
		return deny.Errorf(deny.EffectEscalation, "tool %q is now %s, it was reviewed as %s", d.Tool, rule.Effect, pin.Effect)
	}
	if rule.Digest != pin.PolicyDigest {
		return deny.Errorf(deny.PolicyDrift, "the rules for %q are now %s, the snapshot pins %s", d.Tool, rule.Digest, pin.PolicyDigest)
	}
	// The contract is the pinned one; now its rules.
	return s.checkTerms(d, snap, rule, live.Digest, live.InputSchema)
}

// checkTerms holds the arguments to the pinned inputSchema and the pinned
// policy's constraints, and the call to its sequence rules.
func (s *Server) checkTerms(d *decision, snap *store.Snapshot, rule policy.Decision, digest string, inputSchema []byte) *deny.Error {
	// Rules.
	args, fail := s.schemas.checkArguments(digest, inputSchema, d.call, d.version, d.params)
	if fail != nil {
		return fail
	}
	// The snapshot is the call log it keeps (store.Snapshot.Follows).
	var log policy.CallLog = snap
	if d.withoutListing {
		log = noCallLog{}
	}
	call := policy.Call{Input: policy.Input{Args: args, Principal: d.Principal, Server: d.ServerID, Tool: d.Tool}, Now: d.now, Snapshot: snap.Epoch, Log: log, Counters: s.counters,
		Arguments: d.call.Arguments, SchemaDigest: d.SchemaDigest, PolicyDigest: rule.Digest, Effect: rule.Effect, Approvals: s.approvals}
	if s.observe[d.ServerID] {
		// The call runs whatever is decided: no person is asked to approve
		// what already happened.
		call.Approvals = observedApprovals{}
	}
	for _, t := range rule.Terms {
		if fail := termFailed(t, call, false); fail != nil {
			return fail
		}
	}
	// Seal. The envelope is sealed before the call is recorded: sealing
	// can still deny, and a term records a call only once nothing else
	// will.
	if fail := s.signEnvelope(d); fail != nil {
		return fail
	}
	// Record. Nothing after this can deny: what is reserved stays taken.
	// A term that denies gives back what the ones before it took
	// (policy.Record).
	reserved, err := policy.Record(rule.Terms, call)
	if err != nil {
		return asDenial(err)
	}
	d.reserved = reserved
	d.Release = s.releaseTicket(d)
	return nil
}

// signEnvelope signs the envelope of an allowed call, binding it to exactly what
// was verified: the handler that runs it can check each part against
// itself before any side effect. For a server that holds a grant key, what
// is the same for every call of the tool under the snapshot is signed once,
// in its grant, and the call is bound by a MAC under the grant's call key.
func (s *Server) signEnvelope(d *decision) *deny.Error {
	if s.signer == nil {
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
	token, err := s.signer.Seal(c)
	if err != nil {
		return deny.Errorf(deny.EnvelopeFailed, "%v", err)
	}
	d.Envelope, d.envelopeID = token, c.ID
	return nil
}

// termFailed checks call against t if t records calls or not as records
// says: why it denies the call, if it does. An error that is no denial is
// the store's, and fails the call closed.
func termFailed(t policy.Term, call policy.Call, records bool) *deny.Error {
	if t.Records() != records {
		return nil
	}
	return asDenial(t.Check(call))
}

// asDenial is err, a term's, as the call's denial: the term's own, or any
// other error the store's, which fails the call closed.
func asDenial(err error) *deny.Error {
	if err == nil {
		return nil
	}
	if de, ok := deny.As(err); ok {
		return de
	}
	return storeFailed(err)
}

var _ policy.CallLog = (*store.Snapshot)(nil)

// staleRead decides a pinned call while the catalog is unavailable: only a
// read, only if the operator allowed it, only on the last list still
// showing the pinned definition, and audited as such.
func (s *Server) staleRead(d *decision, r *Rules, pin store.Pin, list *catalog.List, catalogFail *deny.Error) *deny.Error {
	if !s.freshness.AllowStaleReads || pin.Effect != policy.Read || list == nil {
		return catalogFail
	}
	last, ok := list.Tools[d.Tool]
	if !ok || last.Digest != pin.SchemaDigest {
		return catalogFail
	}
	rule, fail := r.admit(r.Policy.For(d.Principal), d.ServerID, d.Tool, last.Digest)
	if fail != nil || rule.Digest != pin.PolicyDigest {
		return catalogFail
	}
	if fail := s.checkTerms(d, d.snapshot, rule, last.Digest, last.InputSchema); fail != nil {
		return fail
	}
	d.staleRead = true
	return nil
}

// lagged returns the store's own newest snapshot when a denial was decided
// on a newest-snapshot pointer that lagged it (a shared store's replica
// learns that another moved it within a millisecond or so), for the call
// to be decided again on it: an agent that has just listed again through
// another replica is held to what it was delivered. A call that names its
// epoch, or that the store cannot serve, did not lag; nil then.
func (s *Server) lagged(d *decision, fail *deny.Error) *store.Snapshot {
	if d.clientEpoch != "" || fail.Reason == deny.StoreUnavailable {
		return nil
	}
	snap, ok, err := s.snapshots.LatestNow(d.Principal, d.ServerID, d.session)
	if err != nil || !ok || (d.snapshot != nil && snap.Epoch == d.snapshot.Epoch) {
		return nil
	}
	return snap
}

// snapshotFor finds the snapshot a call is verified against: the one the
// client names with x-capsnap-epoch, or else the newest for its principal,
// server and session, or else the principal's newest on the server from
// any session.
func (s *Server) snapshotFor(d *decision) (*store.Snapshot, *deny.Error) {
	if d.newest != nil {
		return d.newest, nil
	}
	if d.clientEpoch != "" {
		snap, ok, err := s.snapshots.ByEpoch(d.clientEpoch)
		if err != nil {
			return nil, storeFailed(err)
		}
		s.metrics.lookedUp(ok)
		if !ok {
			return nil, deny.Errorf(deny.NoSnapshot, "no snapshot has epoch %q (it may have expired long ago); list tools again", d.clientEpoch)
		}
		return snap, nil
	}
	snap, ok, err := s.snapshots.Latest(d.Principal, d.ServerID, d.session)
	if err != nil {
		return nil, storeFailed(err)
	}
	if !ok && d.session != "" {
		// A snapshot is the principal's, not its session's: a client whose
		// session ended (a server restart, an expired session) and that
		// re-initialized calls from the list it already holds, within the
		// snapshot's TTL. It was delivered those tools; what it was not
		// delivered stays no_snapshot.
		snap, ok, err = s.snapshots.LatestInAnySession(d.Principal, d.ServerID)
		if err != nil {
			return nil, storeFailed(err)
		}
	}
	s.metrics.lookedUp(ok)
	if !ok {
		return nil, deny.Errorf(deny.NoSnapshot, "no snapshot for this principal on server %q; list tools first", d.ServerID)
	}
	return snap, nil
}

// whyNotPinned explains a call to a tool its snapshot does not pin: the
// server does not serve it, the policy does not allow it, the lockfile does
// not approve it, or it appeared (or was granted) after the snapshot; a
// snapshot never broadens.
func (s *Server) whyNotPinned(d *decision, r *Rules, list *catalog.List, catalogFail *deny.Error) *deny.Error {
	// The definition, when capsnap can see it: the lockfile approves one.
	digest := ""
	if catalogFail == nil {
		live, ok := list.Tools[d.Tool]
		if !ok {
			return deny.Errorf(deny.UnknownTool, "tool %q is not in server %q's live catalog", d.Tool, d.ServerID)
		}
		digest = live.Digest
	}
	rule, fail := r.admit(r.Policy.For(d.Principal), d.ServerID, d.Tool, digest)
	switch {
	case fail != nil && fail.Reason == deny.ToolNotGranted:
		d.allowedTools = s.allowedBy(d.snapshot)
		return fail
	case fail != nil:
		return fail
	case catalogFail != nil:
		return catalogFail
	}
	// Withheld while its change waits for a reviewer, or rejected.
	if fail := s.changeGate(r, d.ServerID, list, d.now).admit(d.Tool, rule); fail != nil {
		return fail
	}
	d.allowedTools = s.allowedBy(d.snapshot)
	return deny.Errorf(deny.NoSnapshot, "snapshot %s does not pin tool %q; list tools again", d.snapshot.Epoch, d.Tool)
}

// allowedBy lists what a snapshot lets its caller call, for a denial that
// sends the caller back to planning: what this caller was delivered and
// authorized against, never what the policy might grant in another
// session.
func (s *Server) allowedBy(snap *store.Snapshot) []string {
	if !s.denials.ListAllowedTools {
		return nil
	}
	out := make([]string, len(snap.Pins))
	for i, p := range snap.Pins {
		out[i] = p.ToolID
	}
	return out
}
