// A call from a caller that never listed, on a server whose operator
// opted in (servers[].calls_without_listing).

package decide

import (
	"strings"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// unlistedEpoch stands for the snapshot a call without listing does not
// have, in its envelope and its audit line.
const unlistedEpoch = "none"

// callWithoutListing decides a tools/call from a caller that holds no
// snapshot on the server: a script or programmatic agent that calls a
// fixed tool by name. With nothing delivered to hold it to, the call is
// held to what is live and approved now: the tool is in the live catalog,
// its definition passes change control and the lockfile, the caller's
// grants allow it, and its arguments satisfy the live inputSchema and the
// policy's terms. What needs a snapshot cannot hold: a sequence rule
// (after) denies, no_snapshot. The call is audited without_snapshot.
func (s *Server) callWithoutListing(d *decision, r *Rules, list *catalog.List) *deny.Error {
	live, ok := list.Tools[d.Tool]
	if !ok {
		return deny.Errorf(deny.UnknownTool, "tool %q is not in server %q's live catalog", d.Tool, d.ServerID)
	}
	rule, fail := r.admit(r.Policy.For(d.Principal), d.ServerID, d.Tool, live.Digest)
	if fail != nil {
		return fail
	}
	if fail := s.changeGate(r, d.ServerID, list, d.now).admit(d.Tool, rule); fail != nil {
		return fail
	}
	d.withoutListing = true
	d.SchemaDigest, d.liveDigest, d.Effect, d.PolicyDigest = live.Digest, live.Digest, rule.Effect, rule.Digest
	// What the envelope binds the call to: no epoch, and no longer than
	// a snapshot would have lasted.
	d.snapshot = &store.Snapshot{Epoch: unlistedEpoch, Principal: d.Principal, ServerID: d.ServerID, ValidUntil: d.now.Add(s.ttl)}
	return s.checkTerms(d, d.snapshot, rule, live.Digest, live.InputSchema)
}

var _ policy.CallLog = noCallLog{}

// noCallLog is the call log of a call without a snapshot: nothing was
// called under it, and nothing is recorded.
type noCallLog struct{}

func (noCallLog) Follows(tool string, after []string, _ bool) (bool, error) {
	if len(after) == 0 {
		return true, nil
	}
	return false, deny.Errorf(deny.NoSnapshot, "%s may be called only after %s under the same snapshot, and this call, made without listing, has none: list tools first", tool, strings.Join(after, " and "))
}
