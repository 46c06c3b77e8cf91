package decide

import (
	"strings"
	"testing"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/store"
)

// laggingStore is a shared store as a replica sees it in the millisecond
// after another replica minted a newer snapshot: its Latest still names
// the one before; LatestNow reads the store.
type laggingStore struct {
	*store.Memory
	lag *store.Snapshot
}

var _ store.Snapshots = (*laggingStore)(nil)

func (l *laggingStore) Latest(principal, serverID, session string) (*store.Snapshot, bool, error) {
	if l.lag != nil {
		return l.lag, true, nil
	}
	return l.Memory.Latest(principal, serverID, session)
}

// An agent that has just listed again, after a drift denial, is held to
// the snapshot it was delivered, not denied again on the one before
// because this replica's pointer lags; a call naming its epoch is held to
// that epoch.
func TestDenialOnALaggingPointerIsDecidedAgain(t *testing.T) {
	var lagging *laggingStore
	f := newFixture(t, func(o *Options) {
		lagging = &laggingStore{Memory: o.Snapshots.(*store.Memory)}
		o.Snapshots = lagging
	})
	first := f.list(t, support, "billing", nil)
	old, _, _ := lagging.ByEpoch(first)
	f.billing.push(t, "testdata/catalog-description.json", nil) // refund redefined
	if o := f.call(t, checkCase{Principal: support, ServerID: "billing", Body: callBody("refund")}); o.reason != deny.SchemaDrift {
		t.Fatalf("after the redeploy: %q, want schema_drift", o.reason)
	}
	second := f.list(t, support, "billing", nil)
	lagging.lag = old
	o := f.call(t, checkCase{Principal: support, ServerID: "billing", Body: callBody("refund")})
	if o.reason != "" || o.upstream[HeaderEpoch] != second {
		t.Fatalf("on a lagging pointer: %q under %s, want allowed under %s", o.reason, o.upstream[HeaderEpoch], second)
	}
	if !strings.Contains(f.audit.String(), `"epoch":"`+second+`"`) {
		t.Errorf("the audit line does not name the snapshot the call was decided on")
	}
	o = f.call(t, checkCase{Principal: support, ServerID: "billing", Body: callBody("refund"), Headers: map[string]string{HeaderEpoch: first}})
	if o.reason != deny.SchemaDrift {
		t.Fatalf("naming the old epoch: %q, want schema_drift", o.reason)
	}
}
