// One tools/list decided, top-down: with discovery.bind delivered (the
// default) the request is let through with a ticket, and the snapshot is
// minted over its own answer (Deliver, in delivery.go); with bind catalog
// it is minted here, from capsnap's own live view.

package decide

import (
	"errors"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/store"
)

// listTools decides the tools/list m, one of msgs.
func (s *Server) listTools(d *decision, msgs []mcpparse.Message, m *mcpparse.Message) *deny.Error {
	d.Method, d.id, d.Name = m.Method, m.ID, ""
	if !s.delivered {
		return s.mint(d)
	}
	// Its response is read as holding one response, the list: the
	// answers to a batch's other requests beside it would be refused
	// with it (a client may take any of them for the list).
	for i := range msgs {
		if &msgs[i] != m && msgs[i].Kind == mcpparse.KindRequest {
			return deny.Errorf(deny.MalformedRequest, "on the response path a tools/list must not share a batch with other requests")
		}
	}
	return s.list(d, m)
}

// mint is the authorize boundary: a passing tools/list mints a snapshot of
// the tools the policy lets this principal call (and its lockfile, if any,
// approves at their live digest), from capsnap's own live view of the
// server, never from what the response will say.
func (s *Server) mint(d *decision) *deny.Error {
	snap, fail := s.newSnapshot(d)
	if fail != nil {
		return fail
	}
	list, fail := s.live(d.ServerID, d.now)
	if fail != nil {
		return fail
	}
	r := s.rules.Load()
	principal := r.Policy.For(d.Principal)
	gate := s.changeGate(r, d.ServerID, list, d.now)
	for name, t := range list.Tools {
		rule, fail := r.admit(principal, d.ServerID, name, t.Digest)
		if fail == nil {
			fail = gate.admit(name, rule)
		}
		if fail != nil {
			continue // not granted, unclassified, unapproved or under review: not in the snapshot
		}
		snap.Pins = append(snap.Pins, store.Pin{ToolID: name, SchemaDigest: t.Digest, Effect: rule.Effect, PolicyDigest: rule.Digest, Seq: snap.Seq})
	}
	return s.store(d, snap)
}

// newSnapshot starts the snapshot a tools/list mints: no pins yet, and the
// store's invalidation sequence, which every pin confirmed now carries.
// The sequence is read before the live view is, so a change that lands
// between the two voids the pin rather than slipping past it.
func (s *Server) newSnapshot(d *decision) (*store.Snapshot, *deny.Error) {
	seq, err := s.snapshots.Seq()
	if err != nil {
		return nil, storeFailed(err)
	}
	return &store.Snapshot{
		Epoch: s.newEpoch(), Principal: d.Principal, ServerID: d.ServerID, Session: d.session,
		ObservedAt: d.now, ValidUntil: d.now.Add(s.ttl), Seq: seq,
	}, nil
}

// store puts a minted snapshot in the store: the decision's snapshot once
// any replica can find it.
func (s *Server) store(d *decision, snap *store.Snapshot) *deny.Error {
	if err := s.snapshots.Put(snap); err != nil {
		if errors.Is(err, store.ErrUnavailable) {
			return storeFailed(err)
		}
		return deny.Errorf(deny.NoSnapshot, "could not store the snapshot: %v", err)
	}
	s.metrics.mintedFor(d.ServerID)
	d.snapshot = snap
	return nil
}

// list is the request half of a tools/list on the response path: the
// catalog must be live to confirm what the response will deliver, and the
// response must come back to capsnap with the ticket.
func (s *Server) list(d *decision, m *mcpparse.Message) *deny.Error {
	if _, fail := s.live(d.ServerID, d.now); fail != nil {
		return fail
	}
	// The response would find no store to mint in.
	if _, err := s.snapshots.Seq(); err != nil {
		return storeFailed(err)
	}
	cursor, _ := m.ParamString("cursor")
	d.Listing = s.seal(listing{
		Principal: d.Principal, ServerID: d.ServerID, Session: d.session, Version: d.version,
		ID: m.ID, Cursor: cursor, RequestID: d.requestID, Expires: d.now.Add(s.ttl).Unix(),
	})
	s.unbound.issued(d.ServerID, d.Listing, d.now)
	return nil
}
