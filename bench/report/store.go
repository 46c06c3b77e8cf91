package report

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/capsnap/capsnap/bench/gobench"
	"github.com/capsnap/capsnap/bench/mcpload"
)

// The shared snapshot store on Redis (issue 15): figures without a target.

// storeCases describe BenchmarkCheckStore's cases: the store, and the
// snapshot the Check is decided under.
var storeCases = map[string]struct{ store, snapshot string }{
	"memory":              {"memory", "held: minted by this process"},
	"redis":               {"Redis", "held: minted by this replica, or read before"},
	"memory_apart":        {"memory", "held, the timer stopped and started before each Check, as below"},
	"memory_fresh":        {"memory", "new for each Check, minted by this process"},
	"redis_other_replica": {"Redis", "new for each Check, minted by another replica: first use here"},
}

// checkStore is BenchmarkCheckStore's result for case c, if it ran.
func (s Store) checkStore(c string) (gobench.Result, bool) {
	return gobench.Find(s.Bench, fmt.Sprintf(BenchCheckStore, c))
}

func (s Store) redisSnapshots() (gobench.Result, bool) {
	return gobench.Find(s.Bench, fmt.Sprintf(BenchSnapshotsRedis, RedisSnapshots))
}

// perCheck is "11 µs, 22 allocs" of a benchmark, or "not run".
func perCheck(r gobench.Result, ok bool) string {
	if !ok {
		return "not run"
	}
	return fmt.Sprintf("%s, %s allocs", nsop(r), metric(r, "allocs/op"))
}

// envoyFigures is "1204 calls/s, p50 12.0 ms, p99 30.1 ms" of mode, or
// "not run".
func envoyFigures(r *Results, mode string) string {
	e, ok := r.Mode(mode)
	if !ok {
		return "not run"
	}
	return fmt.Sprintf("%.0f calls/s, p50 %s, p99 %s", e.RPS, Dur(e.P50), Dur(e.P99))
}

// storeFigures is the summary under the targets: issue 15 sets none, so
// each figure says what it measures instead of what it must meet.
func storeFigures(b *strings.Builder, r *Results) {
	s := r.Store
	fmt.Fprintf(b, "## Shared snapshot store (issue 15): figures, no targets\n\n")
	fmt.Fprintf(b, "Issue 15 (several replicas sharing snapshots in Redis, `snapshots.store: redis`) sets no numeric target, so these are figures rather than verdicts; each is detailed under [Shared snapshot store](#shared-snapshot-store-redis).\n\n")
	held, okHeld := s.checkStore("redis")
	mem, okMem := s.checkStore("memory")
	other, okOther := s.checkStore("redis_other_replica")
	fresh, okFresh := s.checkStore("memory_fresh")
	apart, okApart := s.checkStore("memory_apart")
	inv := s.Invalidation
	invalidation := "not run"
	if len(inv.Trials) > 0 {
		invalidation = fmt.Sprintf("p50 %s, p99 %s (max %s, %d trials)", Dur(inv.P50), Dur(inv.P99), Dur(inv.Max), len(inv.Trials))
	}
	memory := "not run"
	if res, ok := s.redisSnapshots(); ok {
		per := res.Metrics["redis-B/snapshot"]
		memory = fmt.Sprintf("%.0f B/snapshot → %.2f GiB per 1,000,000; one snapshot key %s B, its pointer %s B",
			per, per*1e6/(1<<30), metric(res, "snapshot-key-B"), metric(res, "pointer-key-B"))
	}
	table(b, []string{"figure", "what it measures", "this run"}, [][]string{
		{"the allowed Check on the Redis store, snapshot held",
			"`BenchmarkCheckStore/redis`: BenchmarkCheckAllowed's refund, decided in process by a replica that holds the snapshot and has seen refund's sequence rule satisfied: no round trip to Redis",
			fmt.Sprintf("%s (memory store: %s)", perCheck(held, okHeld), perCheck(mem, okMem))},
		{"the allowed Check on the Redis store, first use on another replica",
			"`BenchmarkCheckStore/redis_other_replica`: the same refund under a snapshot replica A has just minted, checked by replica B, which reads its pointer and the snapshot from Redis",
			fmt.Sprintf("%s (memory store, a new snapshot each Check: %s; timed the same way, a held one: %s)", perCheck(other, okOther), perCheck(fresh, okFresh), perCheck(apart, okApart))},
		{"MCP calls through Envoy to two replicas on Redis",
			fmt.Sprintf("%d sessions posting refund through Envoy, whose capsnap cluster is two replicas sharing one Redis (round robin)", r.Method.EnvoyWorkers),
			fmt.Sprintf("%s (one replica on Redis: %s; one on the memory store: %s)", envoyFigures(r, ModeReplicas), envoyFigures(r, ModeRedis), envoyFigures(r, ModeCapsnap))},
		{"list_changed on replica A to the first drift denial on replica B",
			"from the redeploy's POST to billing to the first `schema_drift` from B, which serves billing from a static catalog and so learns of the change only through the store",
			invalidation},
		{"Redis memory per snapshot",
			fmt.Sprintf("Redis's `used_memory` growth over %s snapshots of the demo's shape, one per agent session, ÷ %s; `MEMORY USAGE` of one snapshot key and of its session's newest-snapshot pointer", thousands(RedisSnapshots), thousands(RedisSnapshots)),
			memory},
	})
}

// storeSection details the shared store's figures.
func storeSection(b *strings.Builder, r *Results) {
	s := r.Store
	fmt.Fprintf(b, "## Shared snapshot store (Redis)\n\n")
	fmt.Fprintf(b, "capsnap replicas share their snapshots, the invalidations of changed tools and the calls that sequence rules need in one Redis (`cache/redis`, `snapshots.store: redis`). "+
		"Every figure here is against a real %s on loopback, on the same cores as everything else.\n\n", orUnknown(r.Machine.Redis, "redis-server"))

	fmt.Fprintf(b, "### The allowed Check in process (Go benchmarks, `decide`)\n\n")
	fmt.Fprintf(b, "`BenchmarkCheckStore`: BenchmarkCheckAllowed's refund (its schema, two CEL constraints and the sequence rule refund after lookup_order) on the memory store and on the Redis store. "+
		"With a new snapshot for each Check, the listing that mints it and the lookup_order its sequence rule wants are made outside the timer, each in a new agent session; on Redis, by replica A (a second store on the same Redis, in the same process), and the Check is replica B's first use of the snapshot. "+
		"Stopping the timer and starting it again costs a Check something by itself (Go's StartTimer reads the memory statistics, which flushes the allocator's per-CPU caches): `memory_apart` is `memory` timed that way, and the new-snapshot cases compare with it.\n\n")
	base, hasBase := s.checkStore("memory")
	var rows [][]string
	for _, c := range StoreCases {
		sc := storeCases[c]
		res, ok := s.checkStore(c)
		if !ok {
			rows = append(rows, []string{sc.store, sc.snapshot, "not run", "", "", "", "`" + c + "`"})
			continue
		}
		vs := "–"
		if hasBase {
			vs = fmt.Sprintf("%.1f×", res.Metrics["ns/op"]/base.Metrics["ns/op"])
		}
		rows = append(rows, []string{sc.store, sc.snapshot, nsop(res), vs, metric(res, "B/op"), metric(res, "allocs/op"), "`" + c + "`"})
	}
	table(b, []string{"store", "the snapshot", "per Check", "× memory, held", "B/op", "allocs/op", "case"}, rows)
	fmt.Fprintf(b, "\nOn Redis, an allowed call whose snapshot the replica holds reads nothing from Redis (its newest-snapshot pointer comes from the client-side cache Redis keeps current, the snapshot from the replica's own copy), and a sequence rule costs one round trip the first time each replica sees it satisfied under a snapshot (the rule is checked, and the call recorded, in Redis), none after: a record is never removed while its snapshot lives, so the replica keeps what it has seen. "+
		"A call of a tool a rule names as a predecessor is recorded once per snapshot the same way. "+
		"A first use on another replica adds two: the session's pointer, then the snapshot, whose MAC and JSON it checks and decodes.\n")

	fmt.Fprintf(b, "\n### Through Envoy: one replica and two\n\n")
	fmt.Fprintf(b, "The same %d sessions and turns as [Through the real Envoy](#through-the-real-envoy), with capsnap on the memory store, capsnap on Redis, and two capsnap replicas sharing that Redis behind Envoy's capsnap cluster (round robin: consecutive calls of a session alternate between the replicas). "+
		"On this machine every replica, Envoy, billing, Redis and the load share the same %d cores: a second replica adds no CPU here, so this measures what sharing the store costs, not what scaling out gains.\n\n", r.Method.EnvoyWorkers, r.Machine.Cores)
	memMode, hasMem := r.Mode(ModeCapsnap)
	rows = nil
	for _, m := range []struct{ mode, name string }{
		{ModeCapsnap, "one replica, memory store"}, {ModeRedis, "one replica, Redis"}, {ModeReplicas, "two replicas, one Redis"},
	} {
		e, ok := r.Mode(m.mode)
		if !ok {
			rows = append(rows, []string{m.name, "not run", "", "", "", "", ""})
			continue
		}
		vs, added := "–", "–"
		if hasMem && m.mode != ModeCapsnap && memMode.RPS > 0 {
			vs, added = fmt.Sprintf("%.2f×", e.RPS/memMode.RPS), signed(e.P50-memMode.P50)
		}
		rows = append(rows, []string{m.name, fmt.Sprintf("%.0f", e.RPS), vs, Dur(e.P50), added, Dur(e.P99), fmt.Sprint(e.Calls)})
	}
	table(b, []string{"capsnap", "calls/s", "× memory store", "p50", "added p50", "p99", "calls"}, rows)

	inv := s.Invalidation
	fmt.Fprintf(b, "\n### Invalidation across replicas\n\n")
	fmt.Fprintf(b, "Two replicas share one Redis. Replica A serves billing live; replica B serves it from a static catalog file (the baseline's definitions), so that its own view never changes and only the invalidation A writes to the store can deny a call on B. "+
		"%d trials, each: mint a snapshot on A (tools/list, then lookup_order) and check that B allows refund under it; redeploy billing to `description_edit` (`POST /admin/variant`, which sends `notifications/tools/list_changed`, which only A follows) and call refund on B again and again until it denies it `schema_drift` for a tool redefined after the snapshot. "+
		"Measured from just before the redeploy's POST to that denial; \"in Redis\" is when the store's invalidation sequence had moved, read from Redis before each of B's calls (when it moved just before the denying call, the two are the same). "+
		"Then billing is redeployed back to the baseline and the trial waits until A has written that invalidation too, so that the next snapshot pins refund after it. "+
		"The calls go straight to each replica's gRPC Check (no Envoy; the snapshot is minted at the tools/list Check, `discovery: {bind: catalog}`): the resolution is one Check and one Redis GET.\n\n", len(inv.Trials))
	if len(inv.Trials) == 0 {
		fmt.Fprintf(b, "Not run.\n")
	} else {
		var written []time.Duration
		for _, t := range inv.Trials {
			written = append(written, t.Written)
		}
		table(b, []string{"trials", "min", "p50", "p99", "max", "in Redis, p50"},
			[][]string{{fmt.Sprint(len(inv.Trials)), Dur(inv.Min), Dur(inv.P50), Dur(inv.P99), Dur(inv.Max), Dur(median(written))}})
		rows = nil
		for i, t := range inv.Trials {
			rows = append(rows, []string{fmt.Sprint(i + 1), Dur(t.Elapsed), Dur(t.Written), Dur(t.Post), fmt.Sprint(t.Polls), fmt.Sprint(t.Allowed)})
		}
		fmt.Fprintf(b, "\n<details><summary>Every trial</summary>\n\n")
		table(b, []string{"trial", "to B's denial", "of which until in Redis", "of which the POST", "calls to B", "allowed by B"}, rows)
		fmt.Fprintf(b, "\n</details>\n")
	}

	fmt.Fprintf(b, "\n### Redis memory per snapshot\n\n")
	fmt.Fprintf(b, "`BenchmarkSnapshotsRedis` mints %s snapshots of the demo's shape (the support agent's on billing, pinning refund and lookup_order), one per agent session, through the Redis store at the tools/list Check, and reads Redis's `INFO memory` before and after: "+
		"the growth counts everything a snapshot adds (its key, its session's newest-snapshot pointer, both keys' expiries, Redis's own overhead). "+
		"`MEMORY USAGE` is of one snapshot key and one pointer key; the record is the snapshot key's value (its MAC and JSON). Then it measures a Check of lookup_order against one of them, picked in turn.\n\n", thousands(RedisSnapshots))
	res, ok := s.redisSnapshots()
	if !ok {
		fmt.Fprintf(b, "Not run.\n")
		return
	}
	per := res.Metrics["redis-B/snapshot"]
	table(b, []string{"snapshots", "used_memory ÷ snapshots", "× 1,000,000", "MEMORY USAGE, snapshot key", "MEMORY USAGE, pointer key", "record", "pins", "a Check among them"},
		[][]string{{thousands(RedisSnapshots), fmt.Sprintf("%.0f B", per), fmt.Sprintf("%.2f GiB", per*1e6/(1<<30)),
			metric(res, "snapshot-key-B") + " B", metric(res, "pointer-key-B") + " B", metric(res, "record-B") + " B", metric(res, "pins/snapshot"), nsop(res)}})
	if live, ok := gobench.Find(r.Scale, fmt.Sprintf(BenchSnapshots, RedisSnapshots)); ok {
		fmt.Fprintf(b, "\nFor comparison, the memory store holds %s live snapshots in %s B of heap each (`BenchmarkSnapshotsLive`, under Scale); on Redis, each replica also keeps its own copy of the snapshots it has used, up to `snapshots.max_snapshots`.\n",
			thousands(RedisSnapshots), metric(live, "B/snapshot"))
	}
}

// storeMethod is the method's bullet for the shared store.
func storeMethod(r *Results) string {
	return fmt.Sprintf("**Shared snapshot store.** Each step that needs Redis, and each Go benchmark case, starts its own empty %s without persistence on a free loopback port; capsnap runs with `snapshots: {store: redis}`, a shared secret, a 1 s operation timeout, and otherwise as in the cases above. "+
		"The timeout is capsnap's `snapshots.redis.timeout`, 200 ms by default: on a busy 2-core machine a Redis answer that late makes the store unavailable and every call denied `store_unavailable` (failing closed), which would fail the run; a figure within either timeout is the same. "+
		"The Go benchmarks (`BenchmarkCheckStore`, `BenchmarkSnapshotsRedis` in `decide`) open cache/redis's store directly, with the same timeout, and are skipped without `$CAPSNAP_REDIS_SERVER`, which make bench sets. "+
		"Through Envoy, capsnap on Redis and the two replicas share that step's redis-server under their own key prefixes; the two replicas are the capsnap cluster's two endpoints, round robin, without health checks.",
		orUnknown(r.Machine.Redis, "redis-server"))
}

// median is the p50 of ds.
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return mcpload.Percentile(s, 50)
}

func orUnknown(s, unknown string) string {
	if s == "" || s == "?" {
		return unknown
	}
	return s
}
