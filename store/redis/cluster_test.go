package redis_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/redis"
	"github.com/capsnap/capsnap/store/storetest"
	"github.com/capsnap/capsnap/testbed"
)

// onCluster opens stores on c's nodes as seeds.
func onCluster(c *testbed.RedisCluster) func(*redis.Options) {
	return func(o *redis.Options) { o.Cluster = c.Addrs() }
}

// The store keeps its contract on a real three-node Redis Cluster, and
// the cluster agrees with TestOneOperationOneSlot's slot function about
// where each key lies.
func TestClusterKeepsTheStoreContract(t *testing.T) {
	c := testbed.StartRedisCluster(t, 3)
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) storetest.Store {
		s, _ := openAt(t, onCluster(c), "", contract(clock))
		return s
	})
	l := redis.Layout{Prefix: "capsnap:"}
	epoch := store.NewEpoch()
	for _, key := range []string{l.Seq(), l.Invalidations(), l.Snapshot(epoch), l.Calls(epoch),
		l.Latest("spiffe://acme/agent", "billing", "s1"), l.AnySession("a}b", "billing"), l.Redeemed("t1")} {
		got, err := c.Nodes[0].Do("CLUSTER", "KEYSLOT", key)
		if err != nil {
			t.Fatal(err)
		}
		if want := strconv.Itoa(int(slot(key))); got != want {
			t.Errorf("CLUSTER KEYSLOT %s = %s, the tests' slot = %s", key, got, want)
		}
	}
}

// Two replicas on a cluster see each other's snapshots, pointers,
// invalidations, recorded calls and redemptions, and the keys spread over
// every node; a replica that holds a snapshot decides a call on it
// without a round trip to any node.
func TestClusterReplicasAgree(t *testing.T) {
	c := testbed.StartRedisCluster(t, 3)
	a, prefix := openAt(t, onCluster(c), "")
	b, _ := openAt(t, onCluster(c), prefix)
	replicasAgree(t, a, b)

	tickets := make([]string, 32)
	for i := range tickets {
		tickets[i] = fmt.Sprintf("ticket-%d", i)
	}
	if err := a.Redeem(tickets[:16], time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := b.Redeemed(tickets)
	if err != nil {
		t.Fatal(err)
	}
	if want := append(slices.Repeat([]bool{true}, 16), make([]bool, 16)...); !slices.Equal(got, want) {
		t.Fatalf("redeemed %v, want %v", got, want)
	}

	for i := range 30 {
		storetest.Put(t, a, storetest.Snapshot(fmt.Sprintf("agent-%d", i), "billing", "", time.Minute))
	}
	sizes, err := c.Each("DBSIZE")
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range sizes {
		if k, _ := strconv.Atoi(n); k == 0 {
			t.Errorf("node %s holds no key: %v", c.Nodes[i].Addr(), sizes)
		}
	}

	snap := storetest.Snapshot("agent", "billing", "s9", time.Minute, store.Pin{ToolID: "refund", SchemaDigest: "sha256:aa"})
	storetest.Put(t, a, snap)
	call := func() {
		t.Helper()
		got, ok, err := b.Latest("agent", "billing", "s9")
		if err != nil || !ok || got.Epoch != snap.Epoch {
			t.Fatalf("Latest = %v, %v", ok, err)
		}
		if _, err := b.ChangedAt("billing", "refund"); err != nil {
			t.Fatal(err)
		}
	}
	call()
	n0 := commands(t, c.Nodes...)
	for range 100 {
		call()
	}
	if n := commands(t, c.Nodes...) - n0; n != len(c.Nodes) {
		t.Fatalf("100 calls made %d round trips to the cluster, want 0 (%d are the INFOs)", n-len(c.Nodes), len(c.Nodes))
	}
}

// A cluster is not taken for one Redis, nor one Redis for a cluster: the
// store stays unavailable and says why.
func TestClusterIsNotOneRedis(t *testing.T) {
	r := testbed.StartRedis(t)
	s, err := redis.Open(redis.Options{Cluster: []string{r.Addr()}, Secret: secret,
		Timeout: 300 * time.Millisecond, ProbeInterval: 50 * time.Millisecond, MaxLocal: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	time.Sleep(300 * time.Millisecond)
	if _, err := s.Seq(); err == nil || !strings.Contains(err.Error(), "is not a Redis Cluster") {
		t.Fatalf("a store on one Redis as a cluster: %v", err)
	}
}

// Options name exactly one Redis, and a prefix with no brace in it.
func TestOptionsAreChecked(t *testing.T) {
	base := redis.Options{Secret: secret, Timeout: time.Second, ProbeInterval: time.Second, MaxLocal: 10}
	for name, edit := range map[string]func(*redis.Options){
		"nowhere":          func(o *redis.Options) {},
		"addr and cluster": func(o *redis.Options) { o.Addr, o.Cluster = "a:1", []string{"b:1"} },
		"addr and sentinel": func(o *redis.Options) {
			o.Addr, o.Sentinel = "a:1", redis.Sentinel{MasterSet: "m", Addrs: []string{"s:1"}}
		},
		"sentinel no addrs": func(o *redis.Options) { o.Sentinel.MasterSet = "m" },
		"sentinel no set":   func(o *redis.Options) { o.Sentinel.Addrs = []string{"s:1"} },
		"cluster db 1":      func(o *redis.Options) { o.Cluster, o.DB = []string{"b:1"}, 1 },
		"brace in prefix":   func(o *redis.Options) { o.Addr, o.KeyPrefix = "a:1", "{capsnap}:" },
	} {
		o := base
		edit(&o)
		if s, err := redis.Open(o); err == nil {
			s.Close()
			t.Errorf("%s: opened", name)
		}
	}
}
