package redis_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/redis"
	"github.com/capsnap/capsnap/testbed"
)

// BenchmarkCapacity is what Redis holds per snapshot, and what a store
// operation sends it, for docs/OPERATIONS.md's capacity section. It
// writes snapshots of k pins, each of its own principal (a SPIFFE ID) and
// MCP session, as tools/list mints them, and reports:
//
//   - redis-B/snapshot: used_memory (INFO memory; on a cluster, summed
//     over the nodes) grown over the count, which is everything a snapshot
//     adds: its record, its two newest-snapshot pointers, their expiries,
//     Redis's own overhead;
//   - snapshots/GiB: 2^30 over that;
//   - snapshot-key-B, latest-key-B, any-key-B: MEMORY USAGE of one
//     snapshot record and its two pointers;
//   - commands/put: the commands one Put (a tools/list's write) sends;
//   - commands/first-read: what a replica that holds no copy sends to
//     find a session's newest snapshot (its first tools/call there).
//
// Then it times a Put. 10,000 snapshots, 1,000 under -short.
func BenchmarkCapacity(b *testing.B) {
	n := 10_000
	if testing.Short() {
		n = 1_000
	}
	for _, k := range []int{2, 10, 50} {
		b.Run(fmt.Sprintf("redis/pins=%d", k), func(b *testing.B) {
			r := testbed.StartRedis(b)
			capacity(b, n, k, func(o *redis.Options) { o.Addr = r.Addr() }, []*testbed.Redis{r}, r.MemoryUsage)
		})
	}
	b.Run("cluster/pins=10", func(b *testing.B) {
		c := testbed.StartRedisCluster(b, 3)
		usage := func(key string) (int64, error) {
			for _, node := range c.Nodes {
				if n, err := node.MemoryUsage(key); err == nil {
					return n, nil
				}
			}
			return 0, fmt.Errorf("no node of the cluster holds %s", key)
		}
		capacity(b, n, 10, onCluster(c), c.Nodes, usage)
	})
}

func capacity(b *testing.B, n, k int, where func(*redis.Options), nodes []*testbed.Redis, usage func(string) (int64, error)) {
	// No probe while commands are counted; so a timeout long enough for a
	// loaded machine, as a store that failed once would stay unavailable.
	quiet := func(o *redis.Options) { o.Retain, o.Timeout, o.ProbeInterval = 5*time.Minute, 5*time.Second, time.Hour }
	a, prefix := openAt(b, where, "", quiet)
	used := func() int64 {
		var sum int64
		for _, r := range nodes {
			m, err := r.UsedMemory()
			if err != nil {
				b.Fatal(err)
			}
			sum += m
		}
		return sum
	}
	before := used()
	snaps := make([]*store.Snapshot, n)
	for i := range snaps {
		snaps[i] = minted(i, k)
		if err := a.Put(snaps[i]); err != nil {
			b.Fatal(err)
		}
	}
	perSnapshot := float64(used()-before) / float64(n)

	keys := redis.Layout{Prefix: prefix}
	s := snaps[0]
	sizes := map[string]string{
		"snapshot-key-B": keys.Snapshot(s.Epoch),
		"latest-key-B":   keys.Latest(s.Principal, s.ServerID, s.Session),
		"any-key-B":      keys.AnySession(s.Principal, s.ServerID),
	}
	size := map[string]int64{}
	for unit, key := range sizes {
		var err error
		if size[unit], err = usage(key); err != nil {
			b.Fatal(err)
		}
	}

	c0 := commands(b, nodes...)
	if err := a.Put(minted(n, k)); err != nil {
		b.Fatal(err)
	}
	put := commands(b, nodes...) - c0 - len(nodes) // less the INFOs
	other, _ := openAt(b, where, prefix, quiet)
	read := func(s *store.Snapshot) {
		if got, ok, err := other.Latest(s.Principal, s.ServerID, s.Session); err != nil || !ok || got.Epoch != s.Epoch {
			b.Fatalf("the other replica's Latest = %v, %v", ok, err)
		}
	}
	// Its connections made (each once: HELLO, CLIENT TRACKING), count a
	// first read.
	for _, s := range snaps[n-10 : n-1] {
		read(s)
	}
	c0 = commands(b, nodes...)
	read(snaps[n-1])
	firstRead := commands(b, nodes...) - c0 - len(nodes)

	i := n + 1
	for b.Loop() {
		if err := a.Put(minted(i, k)); err != nil {
			b.Fatal(err)
		}
		i++
	}
	for unit, m := range size {
		b.ReportMetric(float64(m), unit)
	}
	b.ReportMetric(perSnapshot, "redis-B/snapshot")
	b.ReportMetric(float64(1<<30)/perSnapshot, "snapshots/GiB")
	b.ReportMetric(float64(put), "commands/put")
	b.ReportMetric(float64(firstRead), "commands/first-read")
}

// minted is the i-th snapshot of k pins, as a tools/list mints it for an
// agent's own session: tool names, digests and policy digests of real
// length.
func minted(i, k int) *store.Snapshot {
	now := time.Now()
	s := &store.Snapshot{
		Epoch: store.NewEpoch(), Principal: fmt.Sprintf("spiffe://acme.example/ns/agents/sa/agent-%06d", i), ServerID: "billing",
		Session: digest("session", i)[:32], ObservedAt: now, ValidUntil: now.Add(5 * time.Minute), Seq: 42,
	}
	for j := range k {
		s.Pins = append(s.Pins, store.Pin{
			ToolID: fmt.Sprintf("billing_tool_%02d", j), SchemaDigest: "sha256:" + digest("schema", j),
			Effect: policy.Write, PolicyDigest: "sha256:" + digest("policy", j), Seq: 41,
		})
	}
	return s
}

func digest(what string, i int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s %d", what, i))
	return hex.EncodeToString(sum[:])
}
