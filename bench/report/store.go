package report

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/capsnap/capsnap/bench/gobench"
	"github.com/capsnap/capsnap/bench/mcpload"
)

// The shared snapshot store on Redis (issue 15): figures without a target,
// shown under the targets and detailed in a section of their own.

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

// Redis is the run's redis-server.
func (v view) Redis() string { return orUnknown(v.Machine.Redis, "redis-server") }

// StoreCase is the cells of BenchmarkCheckStore's case c: per Check,
// against the memory store with the snapshot held, B/op and allocs/op.
func (v view) StoreCase(c string) string {
	res, ok := v.Store.checkStore(c)
	if !ok {
		return strings.Join([]string{"not run", "", "", ""}, " | ")
	}
	vs := "–"
	if base, ok := v.Store.checkStore("memory"); ok {
		vs = fmt.Sprintf("%.1f×", res.Metrics["ns/op"]/base.Metrics["ns/op"])
	}
	return strings.Join([]string{nsop(res), vs, metric(res, "B/op"), metric(res, "allocs/op")}, " | ")
}

// ReplicaCase is the cells of capsnap through Envoy in mode: its calls/s
// and p50 against capsnap's on the memory store, its p99 and its calls.
func (v view) ReplicaCase(mode string) string {
	e, ok := v.Mode(mode)
	if !ok {
		return strings.Join([]string{"not run", "", "", "", "", ""}, " | ")
	}
	vs, added := "–", "–"
	if mem, ok := v.Mode(ModeCapsnap); ok && mode != ModeCapsnap && mem.RPS > 0 {
		vs, added = fmt.Sprintf("%.2f×", e.RPS/mem.RPS), signed(e.P50-mem.P50)
	}
	return strings.Join([]string{fmt.Sprintf("%.0f", e.RPS), vs, Dur(e.P50), added, Dur(e.P99), fmt.Sprint(e.Calls)}, " | ")
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
