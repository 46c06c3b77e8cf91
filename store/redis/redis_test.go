package redis_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/redis"
	"github.com/capsnap/capsnap/store/storetest"
	"github.com/capsnap/capsnap/testbed"
)

var secret = []byte("a shared secret of at least 32 bytes, for tests")

// bound is how long a replica may take to see what another wrote, or the
// store to see Redis gone or back: every wait in these tests is bounded by
// it, and what it took is logged.
const bound = 5 * time.Second

var prefixes atomic.Int64

type replica struct {
	*redis.Store
	audit *lockedWriter
	reg   *prometheus.Registry
}

// open opens a store on r under prefix ("" for a new one) and waits until
// it is available.
func open(t testing.TB, r *testbed.Redis, prefix string, edit ...func(*redis.Options)) (*replica, string) {
	t.Helper()
	return openAt(t, func(o *redis.Options) { o.Addr = r.Addr() }, prefix, edit...)
}

// openAt is open on the Redis that where puts in the options: one, a
// cluster, a sentinel's.
func openAt(t testing.TB, where func(*redis.Options), prefix string, edit ...func(*redis.Options)) (*replica, string) {
	t.Helper()
	if prefix == "" {
		prefix = fmt.Sprintf("t%d:", prefixes.Add(1))
	}
	audit := &lockedWriter{}
	reg := prometheus.NewRegistry()
	o := redis.Options{
		Secret: secret, KeyPrefix: prefix,
		Timeout: 300 * time.Millisecond, ProbeInterval: 50 * time.Millisecond,
		Retain: time.Minute, MaxLocal: 10000,
		Audit: zerolog.New(audit), Registerer: reg,
	}
	where(&o)
	for _, e := range edit {
		e(&o)
	}
	s, err := redis.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	waitFor(t, "the store to be available", func() bool { _, err := s.Seq(); return err == nil })
	return &replica{s, audit, reg}, prefix
}

// contract is how the contract's backends are opened: on its clock, if
// it has one, keeping approval requests as long as it expects.
func contract(clock *storetest.Clock) func(*redis.Options) {
	return func(o *redis.Options) {
		o.ApprovalsKept = storetest.Retain
		if clock != nil {
			o.Now = clock.Now
		}
	}
}

func TestKeepsTheStoreContract(t *testing.T) {
	r := testbed.StartRedis(t)
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) storetest.Store {
		s, _ := open(t, r, "", contract(clock))
		return s
	})
}

// A snapshot minted on one replica is the same snapshot on another; a
// newer one minted on the other moves the first's Latest; an invalidation
// and a recorded call seen by one are seen by the other.
func TestReplicasAgree(t *testing.T) {
	r := testbed.StartRedis(t)
	a, prefix := open(t, r, "")
	b, _ := open(t, r, prefix)
	replicasAgree(t, a, b)
}

func replicasAgree(t *testing.T, a, b *replica) {
	refund := store.Pin{ToolID: "refund", SchemaDigest: "sha256:aa", Effect: policy.MoneyMove, PolicyDigest: "sha256:pp"}
	first := storetest.Snapshot("agent", "billing", "s1", time.Minute, refund)
	storetest.Put(t, a, first)
	got, ok, err := b.Latest("agent", "billing", "s1")
	if err != nil || !ok {
		t.Fatalf("Latest on the other replica = %v, %v", ok, err)
	}
	storetest.Same(t, got, first)

	second := storetest.Snapshot("agent", "billing", "s1", time.Minute, refund)
	storetest.Put(t, b, second)
	took := waitFor(t, "replica A's Latest to move to B's snapshot", func() bool {
		got, _, err := a.Latest("agent", "billing", "s1")
		return err == nil && got != nil && got.Epoch == second.Epoch
	})
	t.Logf("a newer snapshot minted on B was A's latest after %v", took)

	before, _ := b.Seq()
	if err := a.Invalidate("billing", []string{"refund"}); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, "replica B to see A's invalidation", func() bool {
		at, err := b.ChangedAt("billing", "refund")
		return err == nil && at > before
	})
	t.Logf("an invalidation written by A was seen by B after %v", took)
	if at, _ := b.ChangedAt("billing", "refund"); at <= second.Pins[0].Seq {
		t.Fatalf("B holds refund changed at %d, not after the pin at %d", at, second.Pins[0].Seq)
	}

	if ok, err := a.Follows(second, "lookup_order", nil, true); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := b.Follows(second, "refund", []string{"lookup_order"}, false); !ok || err != nil {
		t.Fatalf("B did not see the call A recorded: %v, %v", ok, err)
	}
}

// An allowed call whose snapshot a replica holds makes no round trip:
// Redis processes no command between the two INFO calls that bracket
// every read such a call makes. (A sequence rule makes exactly one.)
func TestHotPathStaysLocal(t *testing.T) {
	r := testbed.StartRedis(t)
	a, prefix := open(t, r, "")
	b, _ := open(t, r, prefix, func(o *redis.Options) { o.ProbeInterval = time.Hour })
	snap := storetest.Snapshot("agent", "billing", "", time.Minute, store.Pin{ToolID: "refund", SchemaDigest: "sha256:aa"})
	storetest.Put(t, a, snap)
	call := func() {
		t.Helper()
		got, ok, err := b.Latest("agent", "billing", "")
		if err != nil || !ok || got.Epoch != snap.Epoch {
			t.Fatalf("Latest = %v, %v", ok, err)
		}
		if _, _, err := b.ByEpoch(snap.Epoch); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Seq(); err != nil {
			t.Fatal(err)
		}
		if _, err := b.ChangedAt("billing", "refund"); err != nil {
			t.Fatal(err)
		}
		if ok, err := b.Follows(got, "refund", nil, false); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	call() // first use on this replica: it reads the pointer and the snapshot
	n0 := commands(t, r)
	for range 100 {
		call()
	}
	if n := commands(t, r) - n0; n != 1 {
		t.Fatalf("100 calls made %d round trips to Redis, want 0 (1 is the second INFO)", n-1)
	}
	// A sequence rule: one script, whose own commands run inside Redis.
	sequence := func() {
		t.Helper()
		if ok, err := b.Follows(snap, "refund", []string{"lookup_order"}, true); ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	sequence() // loads the script
	before := commandStats(t, r)
	sequence()
	after := commandStats(t, r)
	// The test's own, and the script's.
	sent := sentExcept(before, after, "info", "sismember", "sadd", "pexpire", "exists")
	if sent != 1 || after["evalsha"]-before["evalsha"] != 1 {
		t.Fatalf("a sequence rule sent %d commands to Redis (%d EVALSHA), want one EVALSHA", sent, after["evalsha"]-before["evalsha"])
	}
	// Once seen satisfied, on this replica, it is satisfied for good: a
	// record outlives no snapshot but is never removed from one. The
	// lookup_order is recorded on the other replica.
	if ok, err := a.Follows(snap, "lookup_order", nil, true); !ok || err != nil {
		t.Fatal(ok, err)
	}
	satisfied := func() {
		t.Helper()
		if ok, err := b.Follows(snap, "refund", []string{"lookup_order"}, true); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	satisfied()
	before = commandStats(t, r)
	for range 100 {
		satisfied()
	}
	after = commandStats(t, r)
	if n := after["evalsha"] - before["evalsha"]; n != 0 {
		t.Fatalf("100 calls under a satisfied sequence rule made %d EVALSHA, want 0", n)
	}
}

// commands is how many commands the Redis servers rs have processed.
func commands(t testing.TB, rs ...*testbed.Redis) int {
	t.Helper()
	n := 0
	for _, calls := range commandStats(t, rs...) {
		n += calls
	}
	return n
}

// commandStats is how many times the Redis servers rs have run each
// command, together.
func commandStats(t testing.TB, rs ...*testbed.Redis) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, r := range rs {
		info, err := r.Do("INFO", "commandstats")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
			if !ok {
				continue
			}
			n, _, _ := strings.Cut(rest, ",")
			calls, _ := strconv.Atoi(n)
			out[name] += calls
		}
	}
	return out
}

// sentExcept is how many commands, but those ignored, Redis ran between
// two commandStats.
func sentExcept(before, after map[string]int, ignored ...string) int {
	n := 0
	for cmd, calls := range after {
		if !slices.Contains(ignored, cmd) {
			n += calls - before[cmd]
		}
	}
	return n
}

// Write access to Redis alone mints nothing: a record that fails its MAC
// is absent (an invalidation: a change now), audited and counted.
func TestForgedRecordsAreRejected(t *testing.T) {
	r := testbed.StartRedis(t)
	a, prefix := open(t, r, "")
	snap := storetest.Snapshot("agent", "billing", "", time.Minute, store.Pin{ToolID: "refund", SchemaDigest: "sha256:aa"})
	storetest.Put(t, a, snap)
	// B has no local copies: it reads what is in Redis.
	b, _ := open(t, r, prefix)

	raw, err := r.Do("GET", redis.Layout{Prefix: prefix}.Snapshot(snap.Epoch))
	if err != nil {
		t.Fatal(err)
	}
	forged := strings.Replace(raw, `"p":"agent"`, `"p":"mallory"`, 1)
	if forged == raw {
		t.Fatalf("no principal in the record %q", raw)
	}
	mustDo(t, r, "SET", redis.Layout{Prefix: prefix}.Snapshot(snap.Epoch), forged)
	if got, ok, err := b.ByEpoch(snap.Epoch); ok || err != nil {
		t.Fatalf("a forged snapshot was read: %+v, %v", got, err)
	}
	// A pointer from mallory's key to agent's snapshot, with agent's MAC.
	agentKey := redis.Layout{Prefix: prefix}.Latest("agent", "billing", "")
	ptr, err := r.Do("GET", agentKey)
	if err != nil {
		t.Fatal(err)
	}
	mustDo(t, r, "SET", redis.Layout{Prefix: prefix}.Latest("mallory", "billing", ""), ptr)
	if got, ok, err := b.Latest("mallory", "billing", ""); ok || err != nil {
		t.Fatalf("a pointer moved to another key was followed: %+v, %v", got, err)
	}
	// A call recorded by a writer without the secret.
	mustDo(t, r, "SADD", redis.Layout{Prefix: prefix}.Calls(snap.Epoch), "lookup_order")
	if ok, err := b.Follows(snap, "refund", []string{"lookup_order"}, false); ok || err != nil {
		t.Fatalf("a forged call satisfied a sequence rule: %v, %v", ok, err)
	}
	// An invalidation with a bad MAC voids every pin of its tool.
	seq, _ := b.Seq()
	mustDo(t, r, "HSET", redis.Layout{Prefix: prefix}.Invalidations(), "7:billingrefund", "1.forged")
	// The next real invalidation makes every replica re-read them all.
	if err := a.Invalidate("billing", []string{"create_invoice"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B to read the forged invalidation as a change now", func() bool {
		at, err := b.ChangedAt("billing", "refund")
		return err == nil && at > seq
	})

	kinds := map[string]float64{}
	for _, k := range []string{"snapshot", "latest", "invalidation"} {
		kinds[k] = value(t, b.reg, "capsnap_store_records_rejected_total", k)
	}
	if kinds["snapshot"] < 1 || kinds["latest"] < 1 || kinds["invalidation"] < 1 {
		t.Fatalf("capsnap_store_records_rejected_total = %v", kinds)
	}
	audit := b.audit.String()
	for _, k := range []string{`"kind":"snapshot"`, `"kind":"latest"`, `"kind":"invalidation"`} {
		if !strings.Contains(audit, k) {
			t.Errorf("no audit line with %s:\n%s", k, audit)
		}
	}

	// A forged sequence leaves the store unavailable: nothing is decided
	// on a sequence an attacker could have lowered.
	mustDo(t, r, "SET", redis.Layout{Prefix: prefix}.Seq(), "x.0.nonce.forged")
	waitFor(t, "a forged sequence to make the store unavailable", func() bool {
		_, err := b.Seq()
		return errors.Is(err, store.ErrUnavailable)
	})
	// Another secret reads nothing of this one's.
	other, err := redis.Open(redis.Options{Addr: r.Addr(), Secret: bytes.Repeat([]byte("x"), 32), KeyPrefix: prefix,
		Timeout: 300 * time.Millisecond, ProbeInterval: 50 * time.Millisecond, MaxLocal: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	time.Sleep(200 * time.Millisecond)
	if _, err := other.Seq(); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a replica with another secret read the sequence: %v", err)
	}
}

// value is the value of the metric name (with the one label value, if
// given) in reg.
func value(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label) {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{%s} in the registry", name, label)
	return 0
}

// lockedWriter lets the audit buffer be written by the store's goroutines
// and read by the test.
type lockedWriter struct {
	mu sync.Mutex
	w  bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

// Redis gone: every operation is unavailable within the bound. Back empty:
// the store serves again by itself, and what it held is gone, even the
// snapshots this replica kept.
func TestRedisGoneAndBackEmpty(t *testing.T) {
	r := testbed.StartRedis(t)
	a, _ := open(t, r, "")
	snap := storetest.Snapshot("agent", "billing", "", time.Minute)
	storetest.Put(t, a, snap)
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, "the store to be unavailable", func() bool {
		_, _, err := a.ByEpoch(snap.Epoch)
		return errors.Is(err, store.ErrUnavailable)
	})
	t.Logf("Redis killed: unavailable after %v", took)
	if err := a.Put(storetest.Snapshot("agent", "billing", "", time.Minute)); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Put while Redis is gone = %v", err)
	}
	if got := value(t, a.reg, "capsnap_store_up", ""); got != 0 {
		t.Errorf("capsnap_store_up = %v while Redis is gone", got)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, "the store to serve again", func() bool { _, err := a.Seq(); return err == nil })
	t.Logf("Redis back: available after %v", took)
	if _, ok, err := a.ByEpoch(snap.Epoch); ok || err != nil {
		t.Fatalf("a snapshot of the lost incarnation was found: %v, %v", ok, err)
	}
	storetest.Put(t, a, storetest.Snapshot("agent", "billing", "", time.Minute))
}

// A replica started while Redis is down says so, at error, once: the trial
// that found this saw only an approval sweep's warning.
func TestRedisDownAtStartIsSaid(t *testing.T) {
	r := testbed.StartRedis(t)
	addr := r.Addr()
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	var log lockedWriter
	s, err := redis.Open(redis.Options{
		Addr: addr, Secret: secret, Timeout: 100 * time.Millisecond, ProbeInterval: 20 * time.Millisecond,
		Retain: time.Minute, MaxLocal: 100, Log: zerolog.New(&log), Audit: zerolog.Nop(), Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const said = "snapshot store unavailable"
	waitFor(t, "the store to say it is unavailable", func() bool { return strings.Contains(log.String(), said) })
	time.Sleep(200 * time.Millisecond) // ten more failed probes
	if n := strings.Count(log.String(), said); n != 1 {
		t.Errorf("said %d times, want once:\n%s", n, log.String())
	}
	if !strings.Contains(log.String(), `"level":"error"`) {
		t.Errorf("not at error:\n%s", log.String())
	}
}

// A stalled Redis is unavailable once an operation outlasts the timeout;
// an invalidation made meanwhile is written when Redis answers again, and
// the store stays unavailable until it is.
func TestStalledRedisAndAPendingInvalidation(t *testing.T) {
	r := testbed.StartRedis(t)
	a, prefix := open(t, r, "")
	b, _ := open(t, r, prefix)
	before, _ := b.Seq()
	if err := r.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := a.Invalidate("billing", []string{"refund"}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Invalidate on a stalled Redis = %v", err)
	}
	if _, err := a.Seq(); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Seq with an invalidation unwritten = %v", err)
	}
	took := waitFor(t, "B to see the stall", func() bool { _, err := b.Seq(); return errors.Is(err, store.ErrUnavailable) })
	t.Logf("Redis stalled: the other replica unavailable after %v", took)
	if err := r.Resume(); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, "B to see the invalidation A could not write", func() bool {
		at, err := b.ChangedAt("billing", "refund")
		return err == nil && at > before
	})
	t.Logf("Redis resumed: the pending invalidation reached the other replica after %v", took)
}

func mustDo(t *testing.T, r *testbed.Redis, args ...string) {
	t.Helper()
	if _, err := r.Do(args...); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
}

// waitFor polls cond until it holds, failing the test after bound, and
// returns how long it took.
func waitFor(t testing.TB, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > bound {
			t.Fatalf("waited %v for %s", bound, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// A replica reads back the pointer it has just moved, though its copy's
// invalidation may come after its write returns; another replica reads
// the store's own pointer with LatestNow at once, and through its copy
// within the bound.
func TestNewestPointerIsReadBack(t *testing.T) {
	r := testbed.StartRedis(t)
	a, prefix := open(t, r, "")
	b, _ := open(t, r, prefix)
	latest := func(st store.Snapshots, now bool) string {
		t.Helper()
		get := st.Latest
		if now {
			get = st.LatestNow
		}
		got, ok, err := get("agent", "billing", "s1")
		if err != nil || !ok {
			t.Fatalf("Latest = %v, %v", ok, err)
		}
		return got.Epoch
	}
	storetest.Put(t, a, storetest.Snapshot("agent", "billing", "s1", time.Minute))
	latest(a, false)
	latest(b, false) // both replicas now hold a copy of the pointer
	for i := range 200 {
		s := storetest.Snapshot("agent", "billing", "s1", time.Minute)
		storetest.Put(t, a, s)
		if got := latest(a, false); got != s.Epoch {
			t.Fatalf("put %d: the writing replica read %s back, not %s", i, got, s.Epoch)
		}
		if got := latest(b, true); got != s.Epoch {
			t.Fatalf("put %d: LatestNow on the other replica is %s, not %s", i, got, s.Epoch)
		}
	}
	last, _, _ := a.Latest("agent", "billing", "s1")
	took := waitFor(t, "the other replica's copy to follow", func() bool { return latest(b, false) == last.Epoch })
	t.Logf("the other replica's copy followed within %v", took)
}

// What a replica remembers having checked in Redis belongs to Redis's
// incarnation: after Redis comes back empty, a pointer record it checked
// before is checked again (and refused, its MAC naming the old
// incarnation), and a call it saw recorded is asked of Redis again (which
// holds no record now).
func TestNewIncarnationForgetsWhatWasSeen(t *testing.T) {
	r := testbed.StartRedis(t)
	a, prefix := open(t, r, "")
	snap := storetest.Snapshot("agent", "billing", "", time.Minute)
	storetest.Put(t, a, snap)
	if got, ok, err := a.Latest("agent", "billing", ""); err != nil || !ok || got.Epoch != snap.Epoch {
		t.Fatalf("Latest = %v, %v, %v", got, ok, err)
	}
	if ok, err := a.Follows(snap, "lookup_order", nil, true); err != nil || !ok {
		t.Fatalf("recording lookup_order: %v, %v", ok, err)
	}
	if ok, err := a.Follows(snap, "refund", []string{"lookup_order"}, false); err != nil || !ok {
		t.Fatalf("refund after lookup_order: %v, %v", ok, err)
	}
	pointer := redis.Layout{Prefix: prefix}.Latest("agent", "billing", "")
	raw, err := r.Do("GET", pointer)
	if err != nil {
		t.Fatal(err)
	}

	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the store to be unavailable", func() bool { _, err := a.Seq(); return errors.Is(err, store.ErrUnavailable) })
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the store to serve again", func() bool { _, err := a.Seq(); return err == nil })
	// The old pointer's bytes, put back as they were.
	mustDo(t, r, "SET", pointer, raw)

	before := value(t, a.reg, "capsnap_store_records_rejected_total", "latest")
	if got, ok, err := a.Latest("agent", "billing", ""); err != nil || ok {
		t.Fatalf("Latest on the old pointer = %v, %v, %v", got, ok, err)
	}
	if got := value(t, a.reg, "capsnap_store_records_rejected_total", "latest"); got != before+1 {
		t.Errorf("records_rejected_total{kind=latest} %v → %v: the old pointer was not checked again", before, got)
	}
	if ok, err := a.Follows(snap, "refund", []string{"lookup_order"}, false); err != nil || ok {
		t.Fatalf("refund after a lookup_order recorded in the lost incarnation: %v, %v", ok, err)
	}
}

// A sequence that goes back — Redis lost acknowledged writes in a
// failover, or an old record was written back — voids its incarnation:
// a replica that saw the later sequence starts a new one, and no pin
// confirmed at a sequence Redis forgot survives to be compared with a
// change given the same number. Both ways back: to the older record, and
// to another record at the number the replica saw, written by a replica
// that never saw the lost one.
func TestSequenceRewoundStartsANewIncarnation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rewind func(t *testing.T, r *testbed.Redis, prefix string)
	}{
		{"older record", func(*testing.T, *testbed.Redis, string) {}},
		{"same number", func(t *testing.T, r *testbed.Redis, prefix string) {
			c, _ := open(t, r, prefix)
			if err := c.Invalidate("billing", []string{"lookup_order"}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testbed.StartRedis(t)
			a, prefix := open(t, r, "")
			// B hears of the rewind only when it next decides.
			b, _ := open(t, r, prefix, func(o *redis.Options) { o.ProbeInterval = time.Hour })
			seq := redis.Layout{Prefix: prefix}.Seq()
			before, err := r.Do("GET", seq)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Invalidate("billing", []string{"refund"}); err != nil {
				t.Fatal(err)
			}
			snap := storetest.Snapshot("agent", "billing", "", time.Minute, store.Pin{ToolID: "refund", SchemaDigest: "sha256:aa"})
			waitFor(t, "B to see A's invalidation", func() bool { n, err := b.Seq(); return err == nil && n == 1 })
			snap.Seq, snap.Pins[0].Seq = 1, 1
			storetest.Put(t, b, snap)

			mustDo(t, r, "SET", seq, before)
			tc.rewind(t, r, prefix)
			// Redis tells B the sequence moved within a millisecond or so.
			waitFor(t, "B to see the sequence go back", func() bool {
				_, err := b.Seq()
				return err == nil && value(t, b.reg, "capsnap_store_sequence_rewound_total", "") == 1
			})
			if got, ok, err := b.ByEpoch(snap.Epoch); ok || err != nil {
				t.Fatalf("a snapshot pinned at a sequence Redis forgot was read: %+v, %v", got, err)
			}
			if !strings.Contains(b.audit.String(), `"event":"store_sequence_rewound"`) {
				t.Errorf("no audit line for the rewound sequence:\n%s", b.audit.String())
			}
			// The new incarnation serves both replicas.
			next := storetest.Snapshot("agent", "billing", "", time.Minute)
			storetest.Put(t, b, next)
			waitFor(t, "A to read the new incarnation's snapshot", func() bool {
				got, ok, err := a.Latest("agent", "billing", "")
				return err == nil && ok && got.Epoch == next.Epoch
			})
		})
	}
}

// The replica that wrote an invalidation Redis then lost sees the
// sequence behind its own write, though it never read that write back:
// the change is not lost unseen.
func TestLostInvalidationIsSeenByItsWriter(t *testing.T) {
	r := testbed.StartRedis(t)
	a, prefix := open(t, r, "", func(o *redis.Options) { o.ProbeInterval = time.Hour })
	snap := storetest.Snapshot("agent", "billing", "", time.Minute, store.Pin{ToolID: "refund", SchemaDigest: "sha256:aa"})
	storetest.Put(t, a, snap)
	seq := redis.Layout{Prefix: prefix}.Seq()
	before, err := r.Do("GET", seq)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Invalidate("billing", []string{"refund"}); err != nil {
		t.Fatal(err)
	}
	mustDo(t, r, "SET", seq, before)
	mustDo(t, r, "DEL", redis.Layout{Prefix: prefix}.Invalidations())
	if _, err := a.Seq(); err != nil {
		t.Fatal(err)
	}
	if n := value(t, a.reg, "capsnap_store_sequence_rewound_total", ""); n != 1 {
		t.Fatalf("capsnap_store_sequence_rewound_total = %v, want 1", n)
	}
	if got, ok, err := a.ByEpoch(snap.Epoch); ok || err != nil {
		t.Fatalf("a snapshot of the incarnation that lost an invalidation was read: %+v, %v", got, err)
	}
}
