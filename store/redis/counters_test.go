package redis_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/redis"
	"github.com/capsnap/capsnap/store/storetest"
	"github.com/capsnap/capsnap/testbed"
)

// Two replicas on one Redis, 64 reservations of 100 at once against a
// budget of 1000, whatever the interleaving: exactly 10 allowed. A replica
// opened again finds every counter as it was, and what one replica gives
// back another can take.
func TestReplicasShareCounters(t *testing.T) {
	r := testbed.StartRedis(t)
	a, prefix := open(t, r, "")
	b, _ := open(t, r, prefix)
	for round := range 5 {
		counter := fmt.Sprintf("daily/%d", round)
		allowed := storetest.Concurrent(t, []policy.Counters{a, b}, counter, 64)
		if len(allowed) != 10 {
			t.Fatalf("round %d: %d of 64 reservations allowed, want 10", round, len(allowed))
		}
		if round > 0 {
			continue
		}
		a.Close()
		c, _ := open(t, r, prefix)
		u, err := c.Reserve(storetest.Charge(counter, 100))
		if err != nil || u.Allowed || u.Used != 1000 || u.RetryAfter <= 0 {
			t.Fatalf("after a replica restart: %+v, %v; want denied with 1000 used and a retry", u, err)
		}
		if err := c.Release(counter, allowed[0].At, 100); err != nil {
			t.Fatal(err)
		}
		if u, err := b.Reserve(storetest.Charge(counter, 100)); err != nil || !u.Allowed || u.Used != 900 {
			t.Fatalf("after one was given back: %+v, %v; want allowed with 900 used", u, err)
		}
		a = c
	}
}

// A reservation is one round trip, a script on one key whose name is all
// hash tag: Redis Cluster routes it to one node.
func TestReservationIsOneRoundTrip(t *testing.T) {
	r := testbed.StartRedis(t)
	// Neither store probes while commands are counted: a probe reads the
	// sequence, as any replica's would.
	quiet := func(o *redis.Options) { o.ProbeInterval = time.Hour }
	_, prefix := open(t, r, "", quiet)
	a, _ := open(t, r, prefix, quiet)
	reserve := func() policy.Usage {
		t.Helper()
		u, err := a.Reserve(storetest.Charge("spiffe://acme/agent\x00daily", 1))
		if err != nil || !u.Allowed {
			t.Fatalf("Reserve = %+v, %v", u, err)
		}
		return u
	}
	release := func(at time.Time) {
		t.Helper()
		if err := a.Release("spiffe://acme/agent\x00daily", at, 1); err != nil {
			t.Fatal(err)
		}
	}
	release(reserve().At) // loads the scripts
	// sent counts the commands run sends Redis, and fails unless it is
	// one EVALSHA whose script ran cmd.
	sent := func(name, cmd string, run func()) {
		t.Helper()
		before := commandStats(t, r)
		run()
		after := commandStats(t, r)
		// The test's own, the other replica's probes, and the scripts'.
		n := sentExcept(before, after, "info", "ping", "hgetall", "hdel", "hincrby", "pexpire", "hexists")
		if evalsha := after["evalsha"] - before["evalsha"]; n != 1 || evalsha != 1 || after[cmd] == before[cmd] {
			t.Fatalf("%s sent %d commands (%d EVALSHA), want one EVALSHA", name, n, evalsha)
		}
	}
	var u policy.Usage
	sent("a reservation", "hgetall", func() { u = reserve() })
	sent("a release", "hexists", func() { release(u.At) })
	reserve()
	keys, err := r.Do("KEYS", prefix+"counter:*")
	if err != nil {
		t.Fatal(err)
	}
	tag, ok := strings.CutPrefix(strings.TrimSpace(keys), prefix+"counter:{22:")
	if !ok || !strings.HasSuffix(tag, "}") || strings.ContainsAny(strings.TrimSuffix(tag, "}"), "{}\n") {
		t.Fatalf("counter keys %q: want one, its name after the prefix all hash tag", keys)
	}
}

// Redis gone: a reservation, and a release, are errors that say the store
// is unavailable, for the core to deny store_unavailable.
func TestCountersFailClosed(t *testing.T) {
	r := testbed.StartRedis(t)
	a, _ := open(t, r, "")
	u, err := a.Reserve(storetest.Charge("daily", 100))
	if err != nil || !u.Allowed {
		t.Fatalf("Reserve = %+v, %v", u, err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a reservation to fail", func() bool {
		_, err := a.Reserve(storetest.Charge("daily", 100))
		return errors.Is(err, store.ErrUnavailable)
	})
	if err := a.Release("daily", u.At, 100); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Release with Redis gone = %v", err)
	}
}

// One reservation on the shared store: one round trip to a redis-server
// on loopback, a script over one counter.
func BenchmarkReserve(b *testing.B) {
	r := testbed.StartRedis(b)
	s, _ := open(b, r, "")
	b.ReportAllocs()
	charge := storetest.Charge("spiffe://acme/agent/support-refund\x00daily_refunds", 0)
	for b.Loop() {
		if u, err := s.Reserve(charge); err != nil || !u.Allowed {
			b.Fatal(u, err)
		}
	}
}
