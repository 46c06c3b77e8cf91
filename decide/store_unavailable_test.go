package decide

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// failingStore is a shared store that cannot answer one kind of request.
type failingStore struct {
	*store.Memory
	fail string
}

var (
	_ store.Snapshots = (*failingStore)(nil)
	_ store.CallLog   = (*failingStore)(nil)
)

func (f *failingStore) err(op string) error {
	if f.fail == op {
		return fmt.Errorf("%w: %s timed out", store.ErrUnavailable, op)
	}
	return nil
}

func (f *failingStore) Put(s *store.Snapshot) error {
	if err := f.err("Put"); err != nil {
		return err
	}
	if err := f.Memory.Put(s); err != nil {
		return err
	}
	// Its calls are this store's, which fails as it is told to.
	s.Keep(f)
	return nil
}

func (f *failingStore) ToolStates(server string, tools []string) (map[string]store.ToolState, error) {
	if err := f.err("ToolStates"); err != nil {
		return nil, err
	}
	return f.Memory.ToolStates(server, tools)
}

func (f *failingStore) Latest(p, srv, sess string) (*store.Snapshot, bool, error) {
	if err := f.err("Latest"); err != nil {
		return nil, false, err
	}
	return f.Memory.Latest(p, srv, sess)
}

func (f *failingStore) ByEpoch(e string) (*store.Snapshot, bool, error) {
	if err := f.err("ByEpoch"); err != nil {
		return nil, false, err
	}
	return f.Memory.ByEpoch(e)
}

func (f *failingStore) Seq() (uint64, error) {
	if err := f.err("Seq"); err != nil {
		return 0, err
	}
	return f.Memory.Seq()
}

func (f *failingStore) ChangedAt(srv, tool string) (uint64, error) {
	if err := f.err("ChangedAt"); err != nil {
		return 0, err
	}
	return f.Memory.ChangedAt(srv, tool)
}

func (f *failingStore) Follows(s *store.Snapshot, tool string, after []string, record bool) (bool, error) {
	if err := f.err("Follows"); err != nil {
		return false, err
	}
	return f.Memory.Follows(s, tool, after, record)
}

// Whatever part of the store cannot answer, the decision that needs it is
// denied store_unavailable: nothing is minted or allowed without it.
func TestStoreUnavailableDenies(t *testing.T) {
	tests := []struct{ fail, step string }{
		{"Seq", "list"},
		{"Put", "list"},
		{"Latest", "call"},
		{"ByEpoch", "call by epoch"},
		{"ChangedAt", "call"},
		{"Follows", "call"},
	}
	for _, tt := range tests {
		t.Run(tt.fail, func(t *testing.T) {
			var failing *failingStore
			f := packFixture(t, func(o *Options) {
				failing = &failingStore{Memory: o.Snapshots.(*store.Memory)}
				o.Snapshots = failing
			})
			if tt.step == "list" {
				failing.fail = tt.fail
				resp, err := f.Check(t.Context(), checkCase{Principal: support, ServerID: "billing", Body: listBody}.request())
				if err != nil {
					t.Fatal(err)
				}
				ticket := ""
				if resp.GetOkResponse() != nil {
					ticket = listingTicket(t, resp)
				}
				var reason deny.Reason
				if ticket == "" {
					for _, h := range resp.GetDeniedResponse().GetHeaders() {
						if h.GetHeader().GetKey() == HeaderReason {
							reason = deny.Reason(h.GetHeader().GetValue())
						}
					}
				} else {
					out := f.Deliver(ticket, ResponseHead{Status: 200, ContentType: "application/json"}, f.served(t, "billing", `"l"`))
					if out.Fail != nil {
						reason = out.Fail.Reason
					}
				}
				if reason != deny.StoreUnavailable {
					t.Fatalf("tools/list with %s failing: %q, want store_unavailable", tt.fail, reason)
				}
				return
			}
			epoch := f.list(t, support, "billing", nil)
			f.call(t, argsCall("lookup_order", lookup))
			failing.fail = tt.fail
			c := argsCall("refund", `{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`)
			if tt.step == "call by epoch" {
				c.Headers = map[string]string{HeaderEpoch: epoch}
			}
			o := f.call(t, c)
			if o.reason != deny.StoreUnavailable {
				t.Fatalf("refund with %s failing: %q, want store_unavailable", tt.fail, o.reason)
			}
			// Why is the operator's: in the audit line, not the answer.
			if strings.Contains(o.data.Detail, "timed out") || !regexp.MustCompile(`"cause":"[^"]*`+tt.fail+` timed out"`).MatchString(f.audit.String()) {
				t.Errorf("the caller reads %q; the audit line's cause is missing", o.data.Detail)
			}
		})
	}
}

func (f *failingStore) Reserve(c policy.Charge) (policy.Usage, error) {
	if err := f.err("Reserve"); err != nil {
		return policy.Usage{}, err
	}
	return f.Memory.Reserve(c)
}
