package report

import (
	"fmt"
	"slices"
	"time"

	"github.com/capsnap/capsnap/bench/gobench"
	"github.com/capsnap/capsnap/bench/mcpload"
)

// The shared snapshot store on Redis (issue 15): figures without a target,
// shown under the targets and detailed in a section of their own.

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

// perCheck is "11 µs, 22 allocs" of a benchmark, or "not run".
func perCheck(r gobench.Result, ok bool) string {
	if !ok {
		return "not run"
	}
	return fmt.Sprintf("%s, %s allocs", nsop(r), metric(r, "allocs/op"))
}

// CheckStore is perCheck of BenchmarkCheckStore's case c.
func (v view) CheckStore(c string) string { return perCheck(v.Store.checkStore(c)) }

// EnvoyFigures is "1204 calls/s, p50 12.0 ms, p99 30.1 ms" of mode, or
// "not run".
func (v view) EnvoyFigures(mode string) (string, error) {
	if !slices.Contains(Modes, mode) && !slices.Contains(StoreModes, mode) {
		return "", fmt.Errorf("no mode %q", mode)
	}
	e, ok := v.Mode(mode)
	if !ok {
		return "not run", nil
	}
	return fmt.Sprintf("%.0f calls/s, p50 %s, p99 %s", e.RPS, Dur(e.P50), Dur(e.P99)), nil
}

// RedisBench is BenchmarkSnapshotsRedis's result, or nil.
func (v view) RedisBench() *gobench.Result {
	res, ok := gobench.Find(v.Store.Bench, fmt.Sprintf(BenchSnapshotsRedis, RedisSnapshots))
	if !ok {
		return nil
	}
	return &res
}

// LiveAtRedisCount is BenchmarkSnapshotsLive's result at as many
// snapshots as BenchmarkSnapshotsRedis mints, or nil.
func (v view) LiveAtRedisCount() *gobench.Result {
	res, ok := gobench.Find(v.Scale, fmt.Sprintf(BenchSnapshots, RedisSnapshots))
	if !ok {
		return nil
	}
	return &res
}

// Redis is the run's redis-server.
func (v view) Redis() string { return orUnknown(v.Machine.Redis, "redis-server") }

// StoreRows are BenchmarkCheckStore's cases, against the memory store
// with the snapshot held.
func (v view) StoreRows() [][]string {
	base, hasBase := v.Store.checkStore("memory")
	var out [][]string
	for _, c := range StoreCases {
		sc := storeCases[c]
		res, ok := v.Store.checkStore(c)
		if !ok {
			out = append(out, []string{sc.store, sc.snapshot, "not run", "", "", "", "`" + c + "`"})
			continue
		}
		vs := "–"
		if hasBase {
			vs = fmt.Sprintf("%.1f×", res.Metrics["ns/op"]/base.Metrics["ns/op"])
		}
		out = append(out, []string{sc.store, sc.snapshot, nsop(res), vs, metric(res, "B/op"), metric(res, "allocs/op"), "`" + c + "`"})
	}
	return out
}

// ReplicaRows are capsnap through Envoy on the memory store, on Redis,
// and as two replicas on Redis, against the first.
func (v view) ReplicaRows() [][]string {
	memMode, hasMem := v.Mode(ModeCapsnap)
	var out [][]string
	for _, m := range []struct{ mode, name string }{
		{ModeCapsnap, "one replica, memory store"}, {ModeRedis, "one replica, Redis"}, {ModeReplicas, "two replicas, one Redis"},
	} {
		e, ok := v.Mode(m.mode)
		if !ok {
			out = append(out, []string{m.name, "not run", "", "", "", "", ""})
			continue
		}
		vs, added := "–", "–"
		if hasMem && m.mode != ModeCapsnap && memMode.RPS > 0 {
			vs, added = fmt.Sprintf("%.2f×", e.RPS/memMode.RPS), signed(e.P50-memMode.P50)
		}
		out = append(out, []string{m.name, fmt.Sprintf("%.0f", e.RPS), vs, Dur(e.P50), added, Dur(e.P99), fmt.Sprint(e.Calls)})
	}
	return out
}

// WrittenP50 is the median time until the invalidation was in Redis.
func (inv Invalidation) WrittenP50() time.Duration {
	var written []time.Duration
	for _, t := range inv.Trials {
		written = append(written, t.Written)
	}
	slices.Sort(written)
	return mcpload.Percentile(written, 50)
}

func orUnknown(s, unknown string) string {
	if s == "" || s == "?" {
		return unknown
	}
	return s
}
