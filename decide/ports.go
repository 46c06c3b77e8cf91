// The ports: every seam between the decision and what it decides with,
// declared together, each with a compile-time check of what implements it.

package decide

import (
	"time"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// Catalog is capsnap's live view of each server's tools: the seam between
// the decision and however the view is kept (MCP client, static file).
type Catalog interface {
	Lookup(serverID string) (*catalog.List, catalog.Status, error)
}

// Store is the store of record: the snapshots, the calls logged under
// them, the listings redeemed, and every principal's budgets and rate
// limits (policy.Counters), in this process or shared by every replica.
// It is one port, implemented whole (store.Backend): a backend that lacks
// a part does not compile, and the decision never asks which parts a
// store has.
type Store = store.Backend

// Approvals are the approvals people give, as an approval rule reads them
// (policy.Approvals); approvals adapts the approval service to it.
type Approvals = policy.Approvals

// Reviews are where a changed tool definition waits for a reviewer: the
// approval service, whose page, API, webhook and audit serve reviews as
// they serve held calls (a review is an approval.Request with a Change).
type Reviews interface {
	Open(req approval.Request) (approval.Request, error)
	Consume(b approval.Binding) (approval.Request, bool, error)
	URL(id string) string
}

// Signer seals the envelope of an allowed call (docs/ENVELOPE.md): whole,
// or under a grant for a server that holds a grant key.
type Signer interface {
	Seal(c *envelope.Claims) (string, error)
	Grant(g envelope.GrantClaims, r *envelope.Recipient) (*envelope.Grant, error)
}

// Each port and what implements it. The Redis store's check is in its own
// package (store/redis), which the decision does not import.
var (
	_ Catalog   = (*catalog.Catalog)(nil)
	_ Store     = (*store.Memory)(nil)
	_ Approvals = approvals{}
	_ Reviews   = (*approval.Service)(nil)
	_ Signer    = (*envelope.Keys)(nil)
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

// storeFailed is the denial of every decision the snapshot store cannot
// serve: nothing is minted or allowed without it. Why it failed (a Redis
// address, a dial error) is the operator's, in the audit line, never the
// caller's.
func storeFailed(err error) *deny.Error {
	return &deny.Error{Reason: deny.StoreUnavailable, Cause: err.Error(),
		Detail: "capsnap's store of record cannot answer now, so nothing can be verified or minted; the operator's audit trail says why"}
}
