package redis_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/redis"
	"github.com/capsnap/capsnap/store/storetest"
	"github.com/capsnap/capsnap/testbed"
)

// An approval granted through one replica is consumed through another,
// once: the first replica then finds it consumed too.
func TestApprovalGrantedOnOneReplicaConsumedOnAnother(t *testing.T) {
	r := testbed.StartRedis(t)
	ra, prefix := open(t, r, "")
	rb, _ := open(t, r, prefix)
	a, b := redis.NewApprovals(ra.Store, time.Hour), redis.NewApprovals(rb.Store, time.Hour)

	now := time.Now()
	bind := storetest.Binding("spiffe://acme/agent/support", "sha256:a1")
	req, opened, err := a.Open(storetest.Request(bind, now), now)
	if err != nil || !opened {
		t.Fatalf("Open on A: %v, %v", opened, err)
	}
	if again, opened, err := b.Open(storetest.Request(bind, now), now); err != nil || opened || again.ID != req.ID {
		t.Fatalf("the agent's retry through B opened %s (%v, %v), want A's %s", again.ID, opened, err, req.ID)
	}
	if _, err := a.Decide(req.ID, approval.Approver{ID: "alice@acme.example"}, true, "", now); err != nil {
		t.Fatal(err)
	}
	got, ok, err := b.Consume(bind, now)
	if err != nil || !ok || got.ID != req.ID {
		t.Fatalf("Consume on B = %s, %v, %v", got.ID, ok, err)
	}
	if _, ok, err := a.Consume(bind, now); ok || err != nil {
		t.Fatalf("consumed again on A: %v, %v", ok, err)
	}
	if s, err := a.Get(req.ID, now); err != nil || s.State != approval.Consumed {
		t.Fatalf("A reads %s, %v; want consumed", s.State, err)
	}
}

// A record written without the secret, or moved from another request's or
// binding's key, is read as absent and audited: write access to Redis
// alone approves nothing.
func TestForgedApprovalsAreRejected(t *testing.T) {
	r := testbed.StartRedis(t)
	rs, prefix := open(t, r, "")
	st := redis.NewApprovals(rs.Store, time.Hour)
	now := time.Now()
	alice := approval.Approver{ID: "alice@acme.example"}

	approved := storetest.Request(storetest.Binding("agent", "sha256:a1"), now)
	if _, _, err := st.Open(approved, now); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Decide(approved.ID, alice, true, "", now); err != nil {
		t.Fatal(err)
	}
	pending := storetest.Request(storetest.Binding("agent", "sha256:a2"), now)
	if _, _, err := st.Open(pending, now); err != nil {
		t.Fatal(err)
	}
	keys := redis.Layout{Prefix: prefix}
	reqKey := keys.ApprovalRequest
	bindKey := func(b approval.Binding) string { return keys.ApprovalBinding(b.Key()) }
	get := func(key string) string {
		v, err := r.Do("GET", key)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// The pending request's record edited to approved, MAC unchanged.
	edited := strings.Replace(get(reqKey(pending.ID)), `"state":"pending"`, `"state":"approved"`, 1)
	if edited == get(reqKey(pending.ID)) {
		t.Fatalf("no state to edit in %s", edited)
	}
	mustDo(t, r, "SET", reqKey(pending.ID), edited)
	// The approved record copied under another id, with its pointer.
	forged := approval.NewID()
	mustDo(t, r, "SET", reqKey(forged), get(reqKey(approved.ID)))
	// The approval's pointer copied to the pending binding's key.
	mustDo(t, r, "SET", bindKey(pending.Binding), get(bindKey(approved.Binding)))

	if _, ok, err := st.Consume(pending.Binding, now); ok || err != nil {
		t.Fatalf("a forged approval consumed: %v, %v", ok, err)
	}
	for _, id := range []string{pending.ID, forged} {
		if _, err := st.Get(id, now); !errors.Is(err, approval.ErrNotFound) {
			t.Errorf("Get(%s) of a forged record = %v, want ErrNotFound", id, err)
		}
	}
	if n := value(t, rs.reg, "capsnap_store_records_rejected_total", "approval"); n < 2 {
		t.Errorf("records_rejected_total{kind=approval} = %v, want at least 2", n)
	}
	if n := value(t, rs.reg, "capsnap_store_records_rejected_total", "approval_binding"); n < 1 {
		t.Errorf("records_rejected_total{kind=approval_binding} = %v, want at least 1", n)
	}
	if !strings.Contains(rs.audit.String(), `"kind":"approval"`) {
		t.Errorf("no audit line for the forged approval:\n%s", rs.audit.String())
	}
	// The genuine approval still holds.
	if _, ok, err := st.Consume(approved.Binding, now); !ok || err != nil {
		t.Fatalf("the genuine approval: %v, %v", ok, err)
	}
}

// With Redis gone, every operation says the store is unavailable, and no
// call is let through.
func TestApprovalsFailClosed(t *testing.T) {
	r := testbed.StartRedis(t)
	rs, _ := open(t, r, "")
	st := redis.NewApprovals(rs.Store, time.Hour)
	now := time.Now()
	bind := storetest.Binding("agent", "sha256:a1")
	req, _, err := st.Open(storetest.Request(bind, now), now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Decide(req.ID, approval.Approver{ID: "alice@acme.example"}, true, "", now); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the store to be unavailable", func() bool {
		_, err := st.Get(req.ID, now)
		return errors.Is(err, store.ErrUnavailable)
	})
	if _, ok, err := st.Consume(bind, now); ok || !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Consume with Redis gone = %v, %v", ok, err)
	}
	if _, _, err := st.Open(storetest.Request(bind, now), now); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Open with Redis gone = %v", err)
	}
	if _, err := st.Decide(req.ID, approval.Approver{ID: "alice@acme.example"}, false, "", now); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Decide with Redis gone = %v", err)
	}
	if _, err := st.List(approval.Filter{}, now); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("List with Redis gone = %v", err)
	}
	if _, err := st.Expire(now); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Expire with Redis gone = %v", err)
	}
}
