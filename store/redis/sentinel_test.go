package redis_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/redis"
	"github.com/capsnap/capsnap/store/storetest"
	"github.com/capsnap/capsnap/testbed"
)

// failoverBound is how long a Sentinel failover may take, from the
// master's death to the store serving on the promoted replica: the
// sentinels wait half a second to call the master down, then elect one of
// themselves and promote the replica.
const failoverBound = 30 * time.Second

// The store finds the master through Sentinel; when the master dies, the
// store is unavailable (failing closed) until Sentinel has promoted the
// replica, and then serves again by itself, on the same incarnation:
// snapshots and invalidations that had reached the replica are still
// there, and replicas still see each other's writes.
func TestSentinelFailover(t *testing.T) {
	s := testbed.StartRedisSentinel(t, 3)
	at := func(o *redis.Options) {
		o.Sentinel = redis.Sentinel{MasterSet: s.MasterSet, Addrs: s.SentinelAddrs()}
	}
	a, prefix := openAt(t, at, "")
	b, _ := openAt(t, at, prefix)
	snap := storetest.Snapshot("agent", "billing", "s1", time.Minute, store.Pin{ToolID: "refund", SchemaDigest: "sha256:aa"})
	storetest.Put(t, a, snap)
	if err := a.Invalidate("billing", []string{"lookup_order"}); err != nil {
		t.Fatal(err)
	}
	before, _ := a.Seq()
	waitFor(t, "the replica to hold every write", func() bool {
		m, err1 := s.Master.Do("INFO", "replication")
		r, err2 := s.Replica.Do("INFO", "replication")
		return err1 == nil && err2 == nil && offset(m, "master_repl_offset") != "" &&
			offset(m, "master_repl_offset") == offset(r, "slave_repl_offset")
	})

	start := time.Now()
	if err := s.Master.Stop(); err != nil {
		t.Fatal(err)
	}
	deadline := start.Add(failoverBound)
	for _, err := a.Seq(); !errors.Is(err, store.ErrUnavailable); _, err = a.Seq() {
		if time.Now().After(deadline) {
			t.Fatalf("the store did not fail closed with its master gone: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	down := time.Since(start)
	for {
		master, err := s.MasterAddr()
		if err == nil && master == s.Replica.Addr() {
			if _, err := a.Seq(); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not serving on the promoted replica %v after the master died (sentinel says %s, %v)", failoverBound, master, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("master killed: unavailable after %v, serving on the promoted replica after %v", down, time.Since(start))

	// A replica that never held a copy reads the snapshot and the
	// invalidation from the promoted replica: the same incarnation.
	c, _ := openAt(t, at, prefix)
	got, ok, err := c.ByEpoch(snap.Epoch)
	if err != nil || !ok {
		t.Fatalf("the snapshot written before the failover: %v, %v", ok, err)
	}
	storetest.Same(t, got, snap)
	if at, err := c.ChangedAt("billing", "lookup_order"); err != nil || at != before {
		t.Fatalf("the invalidation written before the failover is at %d (%v), want %d", at, err, before)
	}
	next := storetest.Snapshot("agent", "billing", "s1", time.Minute)
	storetest.Put(t, a, next)
	waitFor(t, "B's Latest to move to the snapshot A wrote after the failover", func() bool {
		got, ok, err := b.Latest("agent", "billing", "s1")
		return err == nil && ok && got.Epoch == next.Epoch
	})
}

// offset is the value of name in an INFO section.
func offset(info, name string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v
		}
	}
	return ""
}
