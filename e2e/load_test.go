//go:build e2e

package e2e

// A bounded load and soak run (issue 6, item 6): many concurrent MCP
// clients on the official Go SDK, through the real Envoy, for a bounded
// time and a bounded number of calls, with allowed, denied and drifted
// calls mixed. It asserts that every outcome is one the client expected for
// its kind of call and that the test process leaks no goroutine; it prints
// throughput, latency and capsnap's RSS, and asserts no figure.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/capsnap/capsnap/examples/billing"
	"github.com/capsnap/capsnap/testbed"
)

const (
	loadClients        = 16
	loadDuration       = 10 * time.Second
	loadCallsPerClient = 5000 // a bound of its own, should the run be fast
)

// A loadKind is one kind of client and what it may see.
type loadKind struct {
	name      string
	principal string
	// tool is called with args in every round.
	tool string
	args map[string]any
	// lookupFirst calls lookup_order before the tool, as the seed policy's
	// sequence rule wants of refund.
	lookupFirst bool
	// expect is every acceptable outcome of the tool's call before any
	// redeploy; afterDrift adds those acceptable once billing redeployed.
	expect, afterDrift []string
}

var loadKinds = []loadKind{
	// no_snapshot after a redeploy: a relist billing answered before
	// capsnap's view had confirmed the new refund was delivered without it.
	{"allowed", supportAgent, "refund", refundOf(40, "duplicate_charge"), true,
		[]string{""}, []string{"schema_drift", "handler_drift", "no_snapshot"}},
	{"not granted", readonlyAgent, "refund", refundOf(40, "duplicate_charge"), false,
		[]string{"tool_not_granted"}, nil},
	{"unknown tool", supportAgent, "delete_all_orders", map[string]any{}, false,
		[]string{"unknown_tool"}, nil},
	{"constraint", supportAgent, "refund", refundOf(300, "damaged"), true,
		[]string{"constraint_violation"}, []string{"schema_drift", "no_snapshot"}},
}

// capsnapPID finds the capsnap process serving the stack in dir, by its
// command line (testbed does not expose the pid).
func capsnapPID(t *testing.T, dir string) string {
	t.Helper()
	cfg := filepath.Join(dir, "capsnap.yaml")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if slices.Contains(args, "serve") && slices.Contains(args, cfg) {
			return e.Name()
		}
	}
	t.Fatalf("no capsnap process serving %s", cfg)
	return ""
}

func vmRSS(t *testing.T, pid string) string {
	t.Helper()
	f, err := os.Open(filepath.Join("/proc", pid, "status"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// loadScalar is the sum of every series of capsnap's metric name.
func loadScalar(t *testing.T, s *testbed.Stack, name string) float64 {
	t.Helper()
	families := scrape(t, s.AdminURL())
	var sum float64
	for _, m := range families[name].GetMetric() {
		sum += m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
	}
	return sum
}

func TestLoadSoak(t *testing.T) {
	// Registered first, so run last: after the sessions and the stack are
	// closed by their own cleanups.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		goleak.VerifyNone(t, ignore)
	})
	s := startSeedStack(t)
	pid := capsnapPID(t, s.Dir())
	sample := func(at string) string {
		return fmt.Sprintf("%s: VmRSS %s, heap in use %.1f MiB, goroutines %.0f, snapshots %.0f", at, vmRSS(t, pid),
			loadScalar(t, s, "go_memstats_heap_inuse_bytes")/(1<<20), loadScalar(t, s, "go_goroutines"), loadScalar(t, s, "capsnap_snapshots_active"))
	}
	rss := []string{sample("start")}

	ctx, cancel := context.WithTimeout(context.Background(), loadDuration+30*time.Second)
	defer cancel()
	var drifted atomic.Bool
	deadline := time.Now().Add(loadDuration)

	type result struct {
		kind      string
		outcomes  map[string]int
		latencies []time.Duration
		relists   int
		bad       []string
	}
	results := make([]result, loadClients)
	sessions := make([]session, loadClients)
	versions := []string{"2025-06-18", "2025-11-25", "2026-07-28"}
	// Without a session (2026-07-28) a snapshot is per principal and
	// server: clients of one principal share the latest one, and one
	// client's relist would replace the snapshot another's lookup_order
	// was recorded under (a sequence_violation for its refund). So the
	// sessionless clients name their own epoch, as the design lets them.
	names := func(i int) bool { return versions[i%len(versions)] >= "2026-07-28" }
	for i := range sessions {
		k := loadKinds[i%len(loadKinds)]
		sessions[i] = connect(t, s, "billing", k.principal, versions[i%len(versions)])
		e := sessions[i].list(t)
		if names(i) {
			sessions[i].agent.Send(testbed.EpochHeader, e)
		}
	}

	var wg sync.WaitGroup
	for i := range loadClients {
		k := loadKinds[i%len(loadKinds)]
		c := sessions[i]
		named := names(i)
		res := &results[i]
		res.kind, res.outcomes = k.name, map[string]int{}
		wg.Go(func() {
			expect := func(r string, after bool) bool {
				return slices.Contains(k.expect, r) || after && slices.Contains(k.afterDrift, r)
			}
			timed := func(tool string, args map[string]any) string {
				t0 := time.Now()
				r := faultCall(ctx, c.ClientSession, tool, args)
				res.latencies = append(res.latencies, time.Since(t0))
				return r
			}
			for n := 0; n < loadCallsPerClient && time.Now().Before(deadline) && ctx.Err() == nil; n++ {
				if k.lookupFirst {
					if r := timed("lookup_order", lookupA100); r != "" {
						res.bad = append(res.bad, fmt.Sprintf("lookup_order: %q", r))
						res.outcomes["lookup_order:"+r]++
						continue
					}
				}
				r := timed(k.tool, k.args)
				// Read after the call: a drift is acceptable once the
				// redeploy has begun, even in a call that started before it.
				after := drifted.Load()
				res.outcomes[r]++
				if !expect(r, after) {
					res.bad = append(res.bad, fmt.Sprintf("%s (drifted %v): %q", k.tool, after, r))
				}
				if r == "schema_drift" || r == "handler_drift" || (r == "no_snapshot" && after) {
					// Back to planning: list again, as the denial says.
					if named {
						c.agent.Send(testbed.EpochHeader, "")
					}
					lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
					_, err := c.ListTools(lctx, nil)
					lcancel()
					if err != nil {
						res.bad = append(res.bad, fmt.Sprintf("relist: %v", err))
					}
					if named {
						c.agent.Send(testbed.EpochHeader, c.agent.Epoch())
					}
					res.relists++
				}
			}
		})
	}

	// Two redeploys during the run: refund drifts to description_edit and
	// back to baseline.
	start := time.Now()
	for _, step := range []struct {
		at      time.Duration
		variant string
	}{{loadDuration / 3, billing.DescriptionEdit}, {2 * loadDuration / 3, billing.Baseline}} {
		time.Sleep(time.Until(start.Add(step.at)))
		drifted.Store(true)
		if err := s.Redeploy(ctx, "billing", step.variant); err != nil {
			t.Error(err)
		}
		rss = append(rss, sample(step.at.Round(time.Second).String()))
	}
	wg.Wait()
	elapsed := time.Since(start)
	rss = append(rss, sample("end"))

	var all []time.Duration
	byKind := map[string]map[string]int{}
	relists := 0
	for _, r := range results {
		all = append(all, r.latencies...)
		relists += r.relists
		if byKind[r.kind] == nil {
			byKind[r.kind] = map[string]int{}
		}
		for o, n := range r.outcomes {
			if o == "" {
				o = "allow"
			}
			byKind[r.kind][o] += n
		}
		for i, b := range r.bad {
			if i == 5 {
				t.Errorf("%s client: %d more unexpected outcomes", r.kind, len(r.bad)-5)
				break
			}
			t.Errorf("%s client: unexpected %s", r.kind, b)
		}
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration {
		if len(all) == 0 {
			return 0
		}
		return all[min(len(all)-1, int(p*float64(len(all))))]
	}
	t.Logf("%d clients, %d tools/call in %v: %.0f calls/s; latency p50 %v, p99 %v, max %v; %d relists after drift",
		loadClients, len(all), elapsed.Round(time.Millisecond), float64(len(all))/elapsed.Seconds(),
		pct(0.50).Round(time.Microsecond), pct(0.99).Round(time.Microsecond), pct(1).Round(time.Microsecond), relists)
	for _, k := range loadKinds {
		t.Logf("  %-12s %v", k.name, byKind[k.name])
	}
	t.Logf("capsnap (pid %s):\n  %s", pid, strings.Join(rss, "\n  "))
	if byKind["allowed"]["schema_drift"]+byKind["constraint"]["schema_drift"] == 0 {
		t.Error("no call drifted: the redeploys did not reach the clients")
	}
	if byKind["allowed"]["allow"] == 0 {
		t.Error("no call was allowed")
	}

	for _, c := range sessions {
		c.Close()
	}
}
