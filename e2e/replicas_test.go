//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capsnap/capsnap/examples/billing"
	"github.com/capsnap/capsnap/testbed"
)

// Two capsnap replicas share a real Redis behind one Envoy cluster, round
// robin: a snapshot minted on either is verified on either with one
// verdict, for the worked example and each way it can fail.

// replicaStack starts Redis and a stack of two replicas sharing it, on
// the demo's policy (the seed's worked example: refund after lookup_order,
// capped at USD 250).
func replicaStack(t *testing.T, edit func(*testbed.StackOptions)) (*testbed.Stack, *testbed.Redis) {
	t.Helper()
	r := testbed.StartRedis(t)
	policy, err := os.ReadFile("../examples/demo/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := startStackWith(t, func(o *testbed.StackOptions) {
		o.Redis, o.Policy = r.Addr(), policy
		if edit != nil {
			edit(o)
		}
	})
	t.Cleanup(func() {
		if t.Failed() && s.Replica2 != nil {
			t.Logf("--- %s output ---\n%s", s.Replica2.Name, s.Replica2.Output())
		}
	})
	return s, r
}

// replicaVersion is the protocol version of these tests' sessions: one
// whose ping the Go SDK server answers (at 2026-07-28 it refuses the Go
// SDK client's ping for a missing _meta protocolVersion), for nudge.
const replicaVersion = "2025-11-25"

// replicaLine is one audit line of one replica.
type replicaLine struct {
	auditLine
	Replica int
	Phase   string `json:"phase"`
	ID      int    `json:"jsonrpc_id"`
}

// replicaLines are both replicas' audit lines naming epoch.
func replicaLines(s *testbed.Stack, epoch string) []replicaLine {
	var out []replicaLine
	for i := range 2 {
		for _, line := range strings.Split(s.Replica(i).Output(), "\n") {
			var a replicaLine
			if json.Unmarshal([]byte(line), &a) == nil && a.Decision != "" && a.Epoch == epoch {
				a.Replica = i
				out = append(out, a)
			}
		}
	}
	return out
}

// deciders waits for the audit lines of the mint of epoch and of n calls
// under it, and returns the replica that minted it and, in order, each
// call's replica and reason ("" allowed).
func deciders(t *testing.T, s *testbed.Stack, epoch string, n int) (minted int, calls []replicaLine) {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for {
		minted, calls = -1, nil
		for _, l := range replicaLines(s, epoch) {
			switch {
			case l.Method == "tools/list" && l.Phase == "response":
				minted = l.Replica
			case l.Method == "tools/call":
				if l.Decision == "allow" {
					l.Reason = ""
				}
				calls = append(calls, l)
			}
		}
		if minted >= 0 && len(calls) >= n {
			// In the order the session sent them.
			slices.SortFunc(calls, func(a, b replicaLine) int { return a.ID - b.ID })
			return minted, calls
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit lines of epoch %s: minted by %d, %d of %d calls", epoch, minted, len(calls), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nudge sends k pings: each is a Check, which moves Envoy's round robin
// on by one, so that the next call lands on the other replica.
func nudge(t *testing.T, c session, k int) {
	t.Helper()
	for range k {
		if err := c.Ping(context.Background(), nil); err != nil {
			t.Fatalf("ping: %v", err)
		}
	}
}

// onBoth runs attempt twice, the second time one Check later, so that
// whatever Envoy's round robin stands at, between them the step attempt
// checks lands once on each replica; attempt returns the replica that
// made the decision it checks and the one it depends on.
func onBoth(t *testing.T, attempt func(t *testing.T, shift int) (decided, dependsOn int)) {
	t.Helper()
	cross := false
	for shift := range 2 {
		decided, dependsOn := attempt(t, shift)
		cross = cross || decided != dependsOn
	}
	if !cross {
		t.Fatal("in both attempts the same replica made both decisions: no cross-replica verdict was tested")
	}
}

func TestReplicas(t *testing.T) {
	s, r := replicaStack(t, nil)
	lookup := lookupA100
	over := map[string]any{"order_id": "A-100", "amount": 300, "reason_code": "duplicate_charge"}

	t.Run("worked example", func(t *testing.T) {
		onBoth(t, func(t *testing.T, shift int) (int, int) {
			c := connect(t, s, "billing", supportAgent, replicaVersion)
			epoch := c.list(t)
			nudge(t, c, shift)
			if r := c.call(t, "refund", refundA100); r != "sequence_violation" {
				t.Fatalf("refund before lookup_order: %q, want sequence_violation", r)
			}
			if r := c.call(t, "lookup_order", lookup); r != "" {
				t.Fatalf("lookup_order: %q", r)
			}
			nudge(t, c, shift)
			before := starts(t, s, "billing", "refund")
			if r := c.call(t, "refund", refundA100); r != "" {
				t.Fatalf("refund after lookup_order: %q", r)
			}
			if got := starts(t, s, "billing", "refund") - before; got != 1 {
				t.Fatalf("refund handler ran %d times, want once", got)
			}
			if r := c.call(t, "refund", over); r != "constraint_violation" {
				t.Fatalf("refund of USD 300: %q, want constraint_violation", r)
			}
			minted, calls := deciders(t, s, epoch, 4)
			t.Logf("shift %d: minted on %d; calls: %+v", shift, minted, calls)
			// The allowed refund's sequence rule read the lookup_order
			// another replica may have recorded.
			return calls[2].Replica, calls[1].Replica
		})
	})

	t.Run("list on one, call on the other", func(t *testing.T) {
		onBoth(t, func(t *testing.T, shift int) (int, int) {
			c := connect(t, s, "billing", supportAgent, replicaVersion)
			epoch := c.list(t)
			nudge(t, c, shift)
			if r := c.call(t, "lookup_order", lookup); r != "" {
				t.Fatalf("lookup_order: %q", r)
			}
			minted, calls := deciders(t, s, epoch, 1)
			return calls[0].Replica, minted
		})
	})

	t.Run("replayed epoch", func(t *testing.T) {
		onBoth(t, func(t *testing.T, shift int) (int, int) {
			owner := connect(t, s, "billing", supportAgent, replicaVersion)
			epoch := owner.list(t)
			thief := connect(t, s, "billing", readonlyAgent, replicaVersion)
			thief.agent.Send(testbed.EpochHeader, epoch)
			nudge(t, thief, shift)
			before := starts(t, s, "billing", "refund")
			if r := thief.call(t, "refund", refundA100); r != "principal_mismatch" {
				t.Fatalf("replayed epoch: %q, want principal_mismatch", r)
			}
			if starts(t, s, "billing", "refund") != before {
				t.Fatal("a replayed call started its handler")
			}
			minted, calls := deciders(t, s, epoch, 1)
			return calls[0].Replica, minted
		})
	})

	t.Run("drift, and changed back", func(t *testing.T) {
		c := connect(t, s, "billing", supportAgent, replicaVersion)
		epoch := c.list(t)
		redeployBoth(t, s, billing.SkipFraudCheck)
		untilBoth(t, s, c, epoch, "refund", refundA100, "schema_drift")
		redeployBoth(t, s, billing.Baseline)
		untilBoth(t, s, c, epoch, "refund", refundA100, "schema_drift")
	})

	t.Run("Redis stalled, then back", func(t *testing.T) {
		c := connect(t, s, "billing", supportAgent, replicaVersion)
		c.list(t)
		if err := r.Pause(); err != nil {
			t.Fatal(err)
		}
		resumed := false
		defer func() {
			if !resumed {
				_ = r.Resume()
			}
		}()
		waitReason(t, c, "lookup_order", "store_unavailable")
		// Until each replica's probe has seen Redis stall: a replica's first
		// Check after it waits out the store's timeout on each operation it
		// makes, which can outlast Envoy's ext_authz timeout (503), and which
		// replica takes which Check depends on the answers' ext_proc streams
		// as well.
		for deadline := time.Now().Add(opTimeout); faultHTTPStatus(s.ReplicaAdminURL(0)+"/readyz") != 503 || faultHTTPStatus(s.ReplicaAdminURL(1)+"/readyz") != 503; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the replicas' /readyz did not turn 503 within %v of Redis stalling", opTimeout)
			}
		}
		before := starts(t, s, "billing", "lookup_order")
		for range 2 { // consecutive Checks: one on each replica
			if r := c.call(t, "lookup_order", lookup); r != "store_unavailable" {
				t.Fatalf("with Redis stalled: %q, want store_unavailable", r)
			}
		}
		if _, err := c.ListTools(context.Background(), nil); err == nil || denialReason(t, err) != "store_unavailable" {
			t.Fatalf("tools/list with Redis stalled: %v, want store_unavailable", err)
		}
		if starts(t, s, "billing", "lookup_order") != before {
			t.Fatal("a handler ran while Redis was stalled")
		}
		for i := range 2 {
			if code := faultHTTPStatus(s.ReplicaAdminURL(i) + "/readyz"); code != 503 {
				t.Errorf("replica %d /readyz = %d with Redis stalled, want 503", i, code)
			}
		}
		if err := r.Resume(); err != nil {
			t.Fatal(err)
		}
		resumed = true
		// The same snapshot serves again: nothing was lost.
		waitReady(t, s)
		for range 2 { // consecutive Checks: one on each replica
			if r := c.call(t, "lookup_order", lookup); r != "" {
				t.Fatalf("with Redis back: %q", r)
			}
		}
	})

	t.Run("Redis restarted empty", func(t *testing.T) {
		c := connect(t, s, "billing", supportAgent, replicaVersion)
		c.list(t)
		if err := r.Stop(); err != nil {
			t.Fatal(err)
		}
		waitReason(t, c, "lookup_order", "store_unavailable")
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
		// What Redis held is gone, and each replica forgets its copies.
		waitReady(t, s)
		for range 2 { // consecutive Checks: one on each replica
			if r := c.call(t, "lookup_order", lookup); r != "no_snapshot" {
				t.Fatalf("after Redis came back empty: %q, want no_snapshot", r)
			}
		}
		c.list(t)
		for range 2 { // consecutive Checks: one on each replica
			if r := c.call(t, "lookup_order", lookup); r != "" {
				t.Fatalf("after listing again: %q", r)
			}
		}
	})
}

// untilBoth calls tool under epoch until both replicas have decided it,
// each time expecting want: consecutive Checks mostly alternate between
// the replicas, but Envoy's round robin promises no strict order, and on a
// loaded machine a health check may take a replica out for a moment; so
// after the first calls they are spaced out.
func untilBoth(t *testing.T, s *testbed.Stack, c session, epoch, tool string, args map[string]any, want string) {
	t.Helper()
	_, before := deciders(t, s, epoch, 0)
	after := 0 // the JSON-RPC id of this session's last call so far
	for _, l := range before {
		after = max(after, l.ID)
	}
	for n := 1; n <= 20; n++ {
		if n > 2 {
			time.Sleep(50 * time.Millisecond)
		}
		if r := c.call(t, tool, args); r != want {
			t.Fatalf("%s: %q, want %q", tool, r, want)
		}
		_, calls := deciders(t, s, epoch, 0)
		seen := map[int]bool{}
		for _, l := range calls {
			if l.ID > after && l.Tool == tool && l.Reason == want {
				seen[l.Replica] = true
			}
		}
		if seen[0] && seen[1] {
			return
		}
	}
	t.Fatalf("20 calls of %s over a second were all decided by one replica", tool)
}

// redeployBoth redeploys billing and waits until both replicas see it.
func redeployBoth(t *testing.T, s *testbed.Stack, variant string) {
	t.Helper()
	redeploy(t, s, "billing", variant)
	waitReplicaCatalog(t, s, 1, digestOf(t, variant, "refund"))
}

func waitReplicaCatalog(t *testing.T, s *testbed.Stack, replica int, digest string) {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for {
		var view map[string]testbed.CatalogServer
		if resp, err := http.Get(s.ReplicaAdminURL(replica) + "/catalog"); err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&view)
			resp.Body.Close()
		}
		for _, tool := range view["billing"].Tools {
			if tool.Name == "refund" && tool.Digest == digest {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %d never saw refund at %s: %+v", replica, digest, view["billing"])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReady waits until both replicas' /readyz say they serve again.
func waitReady(t *testing.T, s *testbed.Stack) {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for i := range 2 {
		for faultHTTPStatus(s.ReplicaAdminURL(i)+"/readyz") != http.StatusOK {
			if time.Now().After(deadline) {
				t.Fatalf("replica %d not ready within %v", i, opTimeout)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// waitReason calls tool until capsnap answers want (one of the replicas
// may take a probe's interval longer than the other to see Redis change),
// failing after opTimeout.
func waitReason(t *testing.T, c session, tool, want string) {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for {
		got := faultCall(context.Background(), c.ClientSession, tool, lookupA100)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %q, want %q within %v", tool, got, want, opTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A list_changed that only replica 0 sees denies on replica 1: replica 1
// serves billing from a static catalog, so its own view never changes,
// and only the store's invalidation tells it the pinned refund changed.
func TestReplicasShareInvalidations(t *testing.T) {
	s, _ := replicaStack(t, nil)
	tools, err := json.Marshal(map[string]any{"tools": billing.Definitions(billing.Baseline)})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(s.Dir(), "billing-static.json")
	if err := os.WriteFile(file, tools, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.ReplicaConfig(1, fmt.Sprintf("servers:\n  - {id: billing, catalog_file: %s}\n  - {id: payments, url: %s/mcp, resync_interval: 2s}", file, s.ServerURL("payments"))); err != nil {
		t.Fatal(err)
	}
	if err := s.Replica2.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.StartReplica(ctx, 1); err != nil {
		t.Fatal(err)
	}
	waitReplicaCatalog(t, s, 1, digestOf(t, billing.Baseline, "refund"))

	c := connect(t, s, "billing", supportAgent, replicaVersion)
	var epoch string
	// Delivered and pinned by both replicas' views.
	for shift := range 2 {
		epoch = c.list(t)
		nudge(t, c, shift)
		if r := c.call(t, "lookup_order", lookupA100); r != "" {
			t.Fatalf("before the change: %q", r)
		}
	}
	redeploy(t, s, "billing", billing.DescriptionEdit) // replica 0 sees it
	if err := s.Redeploy(ctx, "billing", billing.Baseline); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitCatalog(ctx, "billing", "refund", digestOf(t, billing.Baseline, "refund")); err != nil {
		t.Fatal(err)
	}
	// Both views now say refund is the baseline it was pinned at; only
	// replica 0 saw it change, and change back.
	waitReplicaCatalog(t, s, 1, digestOf(t, billing.Baseline, "refund"))
	untilBoth(t, s, c, epoch, "refund", refundA100, "schema_drift")
	if out := s.Replica2.Output(); !strings.Contains(out, "was redefined after snapshot") {
		t.Fatalf("replica 1 did not deny on the shared invalidation:\n%s", out)
	}
	// A fresh list pins what is live now, on either replica.
	for shift := range 2 {
		c.list(t)
		if r := c.call(t, "lookup_order", lookupA100); r != "" {
			t.Fatalf("lookup_order after relisting: %q", r)
		}
		nudge(t, c, shift)
		if r := c.call(t, "refund", refundA100); r != "" {
			t.Fatalf("refund after relisting: %q", r)
		}
	}
}

// A snapshot minted on one replica expires on the other at its own
// valid_until.
func TestReplicasExpiredSnapshot(t *testing.T) {
	s, _ := replicaStack(t, func(o *testbed.StackOptions) { o.SnapshotTTL = time.Second })
	onBoth(t, func(t *testing.T, shift int) (int, int) {
		c := connect(t, s, "billing", supportAgent, replicaVersion)
		epoch := c.list(t)
		time.Sleep(1100 * time.Millisecond) // the TTL under test
		nudge(t, c, shift)
		if r := c.call(t, "lookup_order", lookupA100); r != "snapshot_expired" {
			t.Fatalf("after the TTL: %q, want snapshot_expired", r)
		}
		minted, calls := deciders(t, s, epoch, 1)
		return calls[0].Replica, minted
	})
}

// A rolling restart of both replicas under a bounded load: every call of
// the support agents is allowed on the snapshot it listed once, the
// read-only agent's refund is never allowed, and no agent is sent back to
// list. Each replica drains (NOT_SERVING, then stops) while Envoy's health
// check moves the Checks to the other.
func TestReplicasRollingRestart(t *testing.T) {
	s, _ := replicaStack(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const agents = 3
	var mu sync.Mutex
	outcomes := map[string]int{}
	forbidden := map[string]int{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range agents + 1 {
		principal, tool, args := supportAgent, "lookup_order", lookupA100
		if i == agents {
			principal, tool, args = readonlyAgent, "refund", refundA100
		}
		c := connect(t, s, "billing", principal, replicaVersion)
		c.list(t)
		wg.Go(func() {
			for n := 0; n < 20000; n++ { // bounded; stop ends it sooner
				select {
				case <-stop:
					return
				default:
				}
				r := faultCall(ctx, c.ClientSession, tool, args)
				mu.Lock()
				if principal == readonlyAgent {
					forbidden[r]++
				} else {
					outcomes[r]++
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	time.Sleep(time.Second)
	drained := [2]int{}
	for i := range 2 {
		t0 := time.Now()
		if err := s.Replica(i).Stop(); err != nil {
			t.Fatalf("stop replica %d: %v", i, err)
		}
		out := s.Replica(i).Output()
		if k := strings.Index(out, "shutting down: draining"); k >= 0 {
			drained[i] = strings.Count(out[k:], `"log":"audit"`)
		}
		if err := s.StartReplica(ctx, i); err != nil {
			t.Fatal(err)
		}
		t.Logf("replica %d restarted in %v", i, time.Since(t0).Round(time.Millisecond))
		time.Sleep(time.Second) // back in Envoy's rotation, and serving
	}
	close(stop)
	wg.Wait()
	for i := range 2 {
		// Decisions made while draining are the ones already on their
		// way when Envoy's health check saw it go.
		n := strings.Count(s.Replica(i).Output(), `"log":"audit"`)
		t.Logf("replica %d: %d decisions while it drained; %d since it restarted", i, drained[i], n)
		if n == 0 {
			t.Errorf("replica %d took no Check after its restart", i)
		}
	}
	t.Logf("support agents' calls: %v; the read-only agent's refunds: %v", outcomes, forbidden)
	for r, n := range outcomes {
		if r != "" {
			t.Errorf("%d calls of the support agents ended %q, want every one allowed", n, r)
		}
	}
	if outcomes[""] < 100 {
		t.Errorf("only %d allowed calls: the load did not run", outcomes[""])
	}
	for r, n := range forbidden {
		if r != "tool_not_granted" {
			t.Errorf("%d refunds of the read-only agent ended %q, want tool_not_granted", n, r)
		}
	}
}
