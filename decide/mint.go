// The authorize boundary at the request: a snapshot minted from capsnap's
// own live view (discovery.bind catalog), and the store it goes to.

package decide

import (
	"errors"
	"time"

	"github.com/capsnap/capsnap/cache"
	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/deny"
)

// live returns the server's catalog and whether it is fresh enough to
// verify against: synced, its connection healthy (or it would miss
// list_changed) and confirmed within the configured age. A stale catalog's
// last list is returned with the failure, for the audited stale-read path.
func (s *Server) live(serverID string, now time.Time) (*catalog.List, *deny.Error) {
	list, st, err := s.catalog.Lookup(serverID)
	if err != nil {
		if de, ok := deny.As(err); ok {
			return list, de
		}
		return list, deny.Errorf(deny.CatalogUnavailable, "server %q: %v", serverID, err)
	}
	if st.LastError != nil {
		return list, deny.Errorf(deny.CatalogUnavailable, "server %q: last refresh failed: %v", serverID, st.LastError)
	}
	if age := now.Sub(st.FetchedAt); age > s.freshness.MaxAge {
		return list, deny.Errorf(deny.CatalogUnavailable, "server %q: catalog is %s old, over the %s bound", serverID, age.Round(time.Millisecond), s.freshness.MaxAge)
	}
	return list, nil
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
	for name, t := range list.Tools {
		rule, fail := r.admit(principal, d.ServerID, name, t.Digest)
		if fail != nil {
			continue // not granted, unclassified or unapproved: not in the snapshot
		}
		snap.Pins = append(snap.Pins, cache.Pin{ToolID: name, SchemaDigest: t.Digest, Effect: rule.Effect, PolicyDigest: rule.Digest, Seq: snap.Seq})
	}
	return s.store(d, snap)
}

// newSnapshot starts the snapshot a tools/list mints: no pins yet, and the
// store's invalidation sequence, which every pin confirmed now carries.
// The sequence is read before the live view is, so a change that lands
// between the two voids the pin rather than slipping past it.
func (s *Server) newSnapshot(d *decision) (*cache.Snapshot, *deny.Error) {
	seq, err := s.snapshots.Seq()
	if err != nil {
		return nil, storeFailed(err)
	}
	return &cache.Snapshot{
		Epoch: s.newEpoch(), Principal: d.Principal, ServerID: d.ServerID, Session: d.session,
		ObservedAt: d.now, ValidUntil: d.now.Add(s.ttl), Seq: seq,
	}, nil
}

// store puts a minted snapshot in the store: the decision's snapshot once
// any replica can find it.
func (s *Server) store(d *decision, snap *cache.Snapshot) *deny.Error {
	if err := s.snapshots.Put(snap); err != nil {
		if errors.Is(err, cache.ErrUnavailable) {
			return storeFailed(err)
		}
		return deny.Errorf(deny.NoSnapshot, "could not store the snapshot: %v", err)
	}
	s.metrics.mintedFor(d.ServerID)
	d.snapshot = snap
	return nil
}

// storeFailed is the denial of every decision the snapshot store cannot
// serve: nothing is minted or allowed without it.
func storeFailed(err error) *deny.Error {
	return deny.Errorf(deny.StoreUnavailable, "%v", err)
}
