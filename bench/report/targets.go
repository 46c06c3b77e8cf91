package report

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/capsnap/capsnap/bench/gobench"
)

// Status is a target's verdict.
type Status string

const (
	Met    Status = "MET"
	Missed Status = "MISSED"
	// NotRun is a target whose benchmark does not exist (yet): neither
	// met nor missed.
	NotRun Status = "NOT RUN"
)

// The targets' ids.
const (
	TargetThroughput   = "throughput"
	TargetP99          = "p99"
	TargetCPU          = "cpu"
	TargetCPUFloor     = "cpu-floor"
	TargetDeployed     = "deployed"
	TargetEnvoy        = "envoy"
	TargetEnvoyExtProc = "envoy-ext-proc"
	TargetDelivery     = "delivery"
	TargetFlat         = "flat"
	TargetMemory       = "memory"
	TargetInvalidation = "invalidation"
	TargetBudget       = "budget"
)

// Thresholds, from issue 17 and, for the targets it does not restate,
// issue 7.
const (
	MinThroughputRatio = 0.85
	MaxP99Ratio        = 1.3
	MaxCPURatio        = 0.1
	// MaxCPUFloorRatio bounds capsnap's CPU per Check at concurrency 1
	// against the floor's.
	MaxCPUFloorRatio = 1.2
	// The in-process allowed Check as deployed (BenchCheckDeployed).
	MaxDeployedNs     = 5_000
	MaxDeployedAllocs = 15
	// Through the real Envoy, capsnap against the floor.
	MinEnvoyRatio    = 0.95
	MaxEnvoyAddedP99 = 500 * time.Microsecond
	// MinEnvoyExtProcRatio is capsnap's against the floor that runs both
	// of its filters, ext_authz and ext_proc: capsnap's own cost, the
	// transport's left out.
	MinEnvoyExtProcRatio = 0.9
	// MaxAddedListingP50 is what a tools/list of a 225-tool catalog
	// through the response path may add to the p50 of the same Envoy
	// without it.
	MaxAddedListingP50 = time.Millisecond
	// MaxFlatRatio is what "flat across catalog sizes" is taken to mean:
	// a Check against 225 or 100,000 tools costs at most 1.5 times one
	// against 10 (ns/op), which leaves room for a benchmark's noise on a
	// shared 2-core machine and none for a cost that grows with the
	// catalog (linear growth would be 10,000 times).
	MaxFlatRatio        = 1.5
	MaxMillionSnapshots = 1 << 30
	MaxInvalidationP99  = 50 * time.Millisecond
	// The Go hot-path budget of issue 7, item 1: the allowed Check.
	MaxCheckNs     = 10_000
	MaxCheckAllocs = 40
)

// judgedAt are the concurrencies issue 17 judges the gRPC ratios at; at 1,
// only CPU against the floor's.
var judgedAt = []int{16, 64}

// The Go benchmarks the targets read.
const (
	BenchCheckAllowed  = "BenchmarkCheckAllowed"
	BenchCheckDeployed = "BenchmarkCheckDeployed"
	BenchCatalogSize   = "BenchmarkCheckCatalogSize/tools=%d"
	BenchSnapshots     = "BenchmarkSnapshotsLive/snapshots=%d"
	// BenchCheckStore's cases are StoreCases; BenchSnapshotsRedis runs
	// RedisSnapshots snapshots.
	BenchCheckStore     = "BenchmarkCheckStore/%s"
	BenchSnapshotsRedis = "BenchmarkSnapshotsRedis/snapshots=%d"
	RedisSnapshots      = 10_000
)

// StoreCases are BenchmarkCheckStore's cases, in the order shown.
var StoreCases = []string{"memory", "redis", "memory_apart", "memory_fresh", "redis_other_replica"}

// CatalogSizes and SnapshotCounts are the scale benchmarks' cases.
var (
	CatalogSizes   = []int{10, 225, 100_000}
	SnapshotCounts = []int{1_000, 10_000, 100_000, 1_000_000}
)

// Target is one of the issues' targets and how this run did.
type Target struct {
	ID string `json:"id"`
	// Issue is the issue that set it.
	Issue     int    `json:"issue"`
	Name      string `json:"name"`
	Threshold string `json:"threshold"`
	Measured  string `json:"measured"`
	Status    Status `json:"status"`
	// Profile is the pprof of the gap, captured for a missed target.
	Profile *Profile `json:"profile,omitempty"`
}

// Profile is a captured profile's top functions.
type Profile struct {
	What    string `json:"what"`
	Command string `json:"command"`
	Top     string `json:"top"`
}

// Evaluate judges r against every target: issue 17's, then those of
// issue 7 it does not restate.
func Evaluate(r *Results) []Target {
	atJudged := "at " + strings.ReplaceAll(ints(judgedAt), ", ", " and ") + " concurrent"
	return []Target{
		perConcurrency(r, Target{ID: TargetThroughput, Name: "capsnap's throughput against the floor's"}, MinThroughputRatio, true,
			"the floor's "+atJudged, judgedAt, func(c, f, _ GRPCRun) float64 { return c.RPS / f.RPS }),
		perConcurrency(r, Target{ID: TargetP99, Name: "capsnap's p99 latency against the floor's"}, MaxP99Ratio, false,
			"the floor's "+atJudged, judgedAt, func(c, f, _ GRPCRun) float64 { return float64(c.P99) / float64(f.P99) }),
		perConcurrency(r, Target{ID: TargetCPU, Name: "capsnap's CPU per Check against OPA-Envoy's"}, MaxCPURatio, false,
			"OPA-Envoy's "+atJudged, judgedAt, func(c, _, o GRPCRun) float64 { return float64(c.CPUPerCheck) / float64(o.CPUPerCheck) }),
		perConcurrency(r, Target{ID: TargetCPUFloor, Name: "capsnap's CPU per Check against the floor's, alone"}, MaxCPUFloorRatio, false,
			"the floor's at concurrency 1", []int{1}, func(c, f, _ GRPCRun) float64 { return float64(c.CPUPerCheck) / float64(f.CPUPerCheck) }),
		checkBudget(r.HotPath, Target{ID: TargetDeployed, Issue: 17, Name: "Go hot path: one allowed Check as deployed, on Redis (snapshot held) with the envelope under a grant (" + BenchCheckDeployed + ")"},
			BenchCheckDeployed, MaxDeployedNs, MaxDeployedAllocs),
		throughEnvoy(r),
		throughEnvoyExtProc(r),
		DeliveryTarget(r.Delivery),
		million(r),
		flat(r.Scale),
		invalidation(r.Invalidation),
		checkBudget(r.HotPath, Target{ID: TargetBudget, Issue: 7, Name: "Go hot path: one allowed Check (" + BenchCheckAllowed + ")"},
			BenchCheckAllowed, MaxCheckNs, MaxCheckAllocs),
	}
}

// perConcurrency judges t, issue 17's ratio of capsnap's run to the
// floor's and OPA's at each concurrency, against limit, a floor if
// atLeast, else a ceiling; it is met only if every one is. against says
// what the ratio is to, in the threshold.
func perConcurrency(r *Results, t Target, limit float64, atLeast bool, against string, at []int, ratioOf func(capsnap, floor, opa GRPCRun) float64) Target {
	sign := map[bool]string{true: "≥", false: "≤"}[atLeast]
	t.Issue, t.Threshold, t.Status = 17, fmt.Sprintf("%s %g× %s", sign, limit, against), Met
	var parts []string
	for _, c := range at {
		cs, ok1 := r.Run(Capsnap, c)
		fl, ok2 := r.Run(Floor, c)
		op, ok3 := r.Run(OPA, c)
		if !ok1 || !ok2 || !ok3 {
			t.Status = NotRun
			parts = append(parts, fmt.Sprintf("c=%d not run", c))
			continue
		}
		ratio := ratioOf(cs, fl, op)
		if met := atLeast && ratio >= limit || !atLeast && ratio <= limit; !met && t.Status == Met {
			t.Status = Missed
		}
		parts = append(parts, fmt.Sprintf("%s× at c=%d", ratioText(ratio, limit), c))
	}
	t.Measured = strings.Join(parts, ", ")
	return t
}

// ratioText is ratio with two decimals, or as many more (up to four) as
// it takes not to read as limit: 0.1003 against 0.1 is 0.1003, not 0.10,
// which would read as met.
func ratioText(ratio, limit float64) string {
	p := 2
	for p < 4 && strconv.FormatFloat(ratio, 'f', p, 64) == strconv.FormatFloat(limit, 'f', p, 64) {
		p++
	}
	return strconv.FormatFloat(ratio, 'f', p, 64)
}

func flat(scale []gobench.Result) Target {
	t := Target{ID: TargetFlat, Issue: 7, Name: "Check cost across catalog sizes (10, 225, 100,000 tools)",
		Threshold: fmt.Sprintf("ns/op at 225 and 100,000 tools ≤ %.1f× at 10", MaxFlatRatio), Status: Met}
	var parts []string
	var base gobench.Result
	for i, n := range CatalogSizes {
		res, ok := gobench.Find(scale, fmt.Sprintf(BenchCatalogSize, n))
		if !ok {
			return notRun(t, fmt.Sprintf(BenchCatalogSize, n))
		}
		if i == 0 {
			base = res
			continue
		}
		ratio := res.Metrics["ns/op"] / base.Metrics["ns/op"]
		if ratio > MaxFlatRatio {
			t.Status = Missed
		}
		parts = append(parts, fmt.Sprintf("%s× at %d tools", ratioText(ratio, MaxFlatRatio), n))
	}
	t.Measured = strings.Join(parts, ", ")
	return t
}

func million(r *Results) Target {
	t := Target{ID: TargetMemory, Issue: 17, Name: "memory of 1,000,000 live snapshots, in process; and on Redis, stated",
		Threshold: "B/snapshot × 1,000,000 < 1 GiB in process", Status: Met}
	onRedis := ""
	if res, ok := gobench.Find(r.Store.Bench, fmt.Sprintf(BenchSnapshotsRedis, RedisSnapshots)); ok {
		if per, has := res.Metrics["redis-B/snapshot"]; has {
			onRedis = fmt.Sprintf("; Redis: %.0f B/snapshot → %.2f GiB", per, per*1e6/(1<<30))
		}
	}
	name := fmt.Sprintf(BenchSnapshots, 1_000_000)
	res, ok := gobench.Find(r.Scale, name)
	if per, has := res.Metrics["B/snapshot"]; !ok || !has {
		t = notRun(t, name+" (B/snapshot)")
	} else {
		t.Measured = fmt.Sprintf("%.0f B/snapshot → %.2f GiB", per, per*1e6/(1<<30))
		if per*1e6 >= MaxMillionSnapshots {
			t.Status = Missed
		}
	}
	t.Measured += onRedis
	return t
}

// checkBudget judges one Go benchmark of the allowed Check against a
// budget of ns and allocations per Check.
func checkBudget(hot []gobench.Result, t Target, bench string, maxNs, maxAllocs float64) Target {
	t.Threshold, t.Status = fmt.Sprintf("≤ %.0f µs and ≤ %.0f allocs per Check", maxNs/1000, maxAllocs), Met
	res, ok := gobench.Find(hot, bench)
	if !ok {
		return notRun(t, bench)
	}
	t.Measured = perCheck(res, true)
	if res.Metrics["ns/op"] > maxNs || res.Metrics["allocs/op"] > maxAllocs {
		t.Status = Missed
	}
	return t
}

// throughEnvoy judges MCP calls through the real Envoy with capsnap
// against the same Envoy with the floor.
func throughEnvoy(r *Results) Target {
	t := Target{ID: TargetEnvoy, Issue: 17, Name: "MCP calls through the real Envoy: ext_authz to capsnap against ext_authz to the floor",
		Threshold: fmt.Sprintf("≥ %.2f× the floor's calls/s, and p99 ≤ the floor's + %s", MinEnvoyRatio, Dur(MaxEnvoyAddedP99)), Status: Met}
	c, ok1 := r.Mode(ModeCapsnap)
	f, ok2 := r.Mode(ModeFloor)
	if !ok1 || !ok2 || f.RPS == 0 {
		return notRun(t, "Envoy runs with capsnap and the floor")
	}
	ratio, added := c.RPS/f.RPS, c.P99-f.P99
	t.Measured = fmt.Sprintf("%s× the calls/s; p99 %s (%s, the floor's %s)", ratioText(ratio, MinEnvoyRatio), signed(added), Dur(c.P99), Dur(f.P99))
	if ratio < MinEnvoyRatio || added > MaxEnvoyAddedP99 {
		t.Status = Missed
	}
	return t
}

// throughEnvoyExtProc judges MCP calls through the real Envoy with capsnap
// against the same Envoy, ext_proc and all, with the floor behind both
// filters: each answer crosses ext_proc in both, so the gap is capsnap's
// work and none of the transport.
func throughEnvoyExtProc(r *Results) Target {
	t := Target{ID: TargetEnvoyExtProc, Issue: 35, Name: "MCP calls through the real Envoy: capsnap against the floor behind ext_authz and ext_proc both",
		Threshold: fmt.Sprintf("≥ %.2f× the ext_authz + ext_proc floor's calls/s", MinEnvoyExtProcRatio), Status: Met}
	c, ok1 := r.Mode(ModeCapsnap)
	f, ok2 := r.Mode(ModeFloorExtProc)
	if !ok1 || !ok2 || f.RPS == 0 {
		return notRun(t, "Envoy runs with capsnap and the ext_authz + ext_proc floor")
	}
	ratio := c.RPS / f.RPS
	t.Measured = fmt.Sprintf("%s× the calls/s (%.0f, the floor's %.0f)", ratioText(ratio, MinEnvoyExtProcRatio), c.RPS, f.RPS)
	if ratio < MinEnvoyExtProcRatio {
		t.Status = Missed
	}
	return t
}

func invalidation(inv Invalidation) Target {
	t := Target{ID: TargetInvalidation, Issue: 7, Name: "redeploy (list_changed) to the first drift denial",
		Threshold: fmt.Sprintf("p99 < %v", MaxInvalidationP99), Status: Met}
	if len(inv.Trials) == 0 {
		return notRun(t, "invalidation trials")
	}
	t.Measured = fmt.Sprintf("p99 %s (p50 %s, max %s, %d trials)", Dur(inv.P99), Dur(inv.P50), Dur(inv.Max), len(inv.Trials))
	if inv.P99 >= MaxInvalidationP99 {
		t.Status = Missed
	}
	return t
}

// DeliveryTarget is issue 17's target for the response path.
func DeliveryTarget(d Delivery) Target {
	t := Target{ID: TargetDelivery, Issue: 17, Name: "added p50 of a tools/list through the response path",
		Threshold: fmt.Sprintf("≤ %s", Dur(MaxAddedListingP50)), Status: Met}
	if !d.Ran() {
		return notRun(t, "listings")
	}
	t.Name += fmt.Sprintf(" (%d-tool catalog)", d.CatalogTools)
	added := d.With.P50 - d.Without.P50
	t.Measured = fmt.Sprintf("%s (p50 %s with, %s without)", signed(added), Dur(d.With.P50), Dur(d.Without.P50))
	if added > MaxAddedListingP50 {
		t.Status = Missed
	}
	return t
}

func notRun(t Target, what string) Target {
	t.Status, t.Measured = NotRun, "not run: no "+what
	return t
}

// Dur formats a latency to three significant figures, in µs below a
// millisecond.
func Dur(d time.Duration) string {
	us := float64(d) / 1e3
	switch {
	case d <= 0:
		return "0"
	case d < time.Microsecond:
		return fmt.Sprintf("%d ns", d.Nanoseconds())
	case us < 10:
		return fmt.Sprintf("%.2f µs", us)
	case us < 1000:
		return fmt.Sprintf("%.0f µs", us)
	case us < 10_000:
		return fmt.Sprintf("%.2f ms", us/1000)
	case us < 1_000_000:
		return fmt.Sprintf("%.1f ms", us/1000)
	default:
		return fmt.Sprintf("%.2f s", us/1e6)
	}
}
