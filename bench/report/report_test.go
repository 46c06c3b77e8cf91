package report

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/bench/gobench"
	"github.com/capsnap/capsnap/bench/grpcload"
	"github.com/capsnap/capsnap/bench/mcpload"
)

// sample is a run in which every target is met but the CPU ones, and the
// million-snapshot, the deployed Check's and the response path's
// benchmarks did not run.
func sample() *Results {
	r := &Results{
		Started: time.Date(2026, 12, 3, 5, 0, 0, 0, time.UTC),
		Machine: Machine{CPU: "Test CPU", Cores: 2, Envoy: "Envoy 1.40.0", Date: "2026-12-03T05:00:00Z"},
		Method:  Method{Concurrencies: []int{1, 16, 64}, Turns: 4, EnvoyWorkers: 16, EnvoyCall: "refund", RequestBody: `{"jsonrpc":"2.0"}`},
	}
	for _, c := range r.Method.Concurrencies {
		r.GRPC = append(r.GRPC,
			GRPCRun{Server: Capsnap, Concurrency: c, Report: grpcload.Report{Count: 900, RPS: 900, P50: 110 * time.Microsecond, P99: 400 * time.Microsecond}, CPUPerCheck: 20 * time.Microsecond},
			GRPCRun{Server: Floor, Concurrency: c, Report: grpcload.Report{Count: 1000, RPS: 1000, P50: 100 * time.Microsecond, P99: 350 * time.Microsecond}, CPUPerCheck: 10 * time.Microsecond},
			GRPCRun{Server: OPA, Concurrency: c, Report: grpcload.Report{Count: 300, RPS: 300, P50: 900 * time.Microsecond, P99: 3 * time.Millisecond}, CPUPerCheck: 150 * time.Microsecond},
		)
	}
	// Through Envoy, every mode at the same calls/s.
	p50 := map[string]time.Duration{ModeNone: time.Millisecond, ModeFloor: 2 * time.Millisecond, ModeFloorExtProc: 2500 * time.Microsecond, ModeCapsnap: 3 * time.Millisecond}
	for _, m := range Modes {
		r.Envoy = append(r.Envoy, EnvoyRun{Mode: m, Result: mcpload.Result{Calls: 100, RPS: 1000, P50: p50[m], P99: 5 * time.Millisecond}})
	}
	bench := func(name string, metrics map[string]float64) gobench.Result {
		return gobench.Result{Pkg: "github.com/capsnap/capsnap/decide", Name: name, Metrics: metrics}
	}
	r.Scale = []gobench.Result{
		bench("BenchmarkCheckCatalogSize/tools=10", map[string]float64{"ns/op": 8000}),
		bench("BenchmarkCheckCatalogSize/tools=225", map[string]float64{"ns/op": 8200}),
		bench("BenchmarkCheckCatalogSize/tools=100000", map[string]float64{"ns/op": 9000}),
		bench("BenchmarkSnapshotsLive/snapshots=1000", map[string]float64{"ns/op": 8000, "B/snapshot": 900}),
	}
	r.HotPath = []gobench.Result{bench(BenchCheckAllowed, map[string]float64{"ns/op": 7000, "allocs/op": 30, "B/op": 2000})}
	r.Invalidation = Invalidation{Trials: []Trial{{Variant: "baseline", Elapsed: 5 * time.Millisecond}}, P50: 5 * time.Millisecond, P99: 5 * time.Millisecond, Max: 5 * time.Millisecond}
	return r
}

func TestEvaluate(t *testing.T) {
	r := sample()
	want := map[string]Status{
		TargetThroughput: Met, TargetP99: Met, TargetCPU: Missed, TargetCPUFloor: Missed, TargetDeployed: NotRun,
		TargetEnvoy: Met, TargetEnvoyExtProc: Met, TargetDelivery: NotRun, TargetFlat: Met,
		TargetMemory: NotRun, TargetInvalidation: Met, TargetBudget: Met,
	}
	got := Evaluate(r)
	if len(got) != len(want) {
		t.Fatalf("%d targets, want %d", len(got), len(want))
	}
	for _, tg := range got {
		if tg.Status != want[tg.ID] {
			t.Errorf("%s: %s (%s), want %s", tg.ID, tg.Status, tg.Measured, want[tg.ID])
		}
	}
	// Concurrency 1 is judged for the CPU against the floor alone, and
	// for nothing else.
	r.GRPC[0].RPS = 500
	if tg := target(t, r, TargetThroughput); tg.Status != Met {
		t.Errorf("throughput judged at c=1: %+v", tg)
	}
	if tg := target(t, r, TargetCPUFloor); tg.Measured != "2.00× at c=1" {
		t.Errorf("CPU against the floor: %+v", tg)
	}
	// One concurrency over the line misses the target.
	r.GRPC[3].RPS = 800
	if tg := Evaluate(r)[0]; tg.Status != Missed || !strings.Contains(tg.Measured, "0.80× at c=16") {
		t.Errorf("throughput: %+v", tg)
	}
	r.Scale = append(r.Scale, gobench.Result{Name: "BenchmarkSnapshotsLive/snapshots=1000000", Metrics: map[string]float64{"B/snapshot": 1100}})
	if tg := target(t, r, TargetMemory); tg.Status != Missed {
		t.Errorf("memory: %+v", tg)
	}
	r.HotPath = append(r.HotPath, gobench.Result{Name: BenchCheckDeployed, Metrics: map[string]float64{"ns/op": 4900, "allocs/op": 16}})
	if tg := target(t, r, TargetDeployed); tg.Status != Missed || tg.Measured != "4.90 µs, 16 allocs" {
		t.Errorf("deployed: %+v", tg)
	}
	envoyRun(t, r, ModeCapsnap).P99 = envoyRun(t, r, ModeFloor).P99 + 600*time.Microsecond
	if tg := target(t, r, TargetEnvoy); tg.Status != Missed || !strings.Contains(tg.Measured, "1.00× the calls/s; p99 +600 µs") {
		t.Errorf("envoy: %+v", tg)
	}
}

// envoyRun is r's run through Envoy in mode, to change.
func envoyRun(t *testing.T, r *Results, mode string) *EnvoyRun {
	t.Helper()
	for i := range r.Envoy {
		if r.Envoy[i].Mode == mode {
			return &r.Envoy[i]
		}
	}
	t.Fatalf("no run in mode %s", mode)
	return nil
}

// capsnap through Envoy is judged against the floor behind both of its
// filters on calls/s alone, and shown against each floor, its ratio to
// the ext_authz floor split into the transport's and its own, each of
// its ratios with the digits that decide its target.
func TestEnvoyFloors(t *testing.T) {
	r := sample()
	envoyRun(t, r, ModeFloor).RPS = 1250
	fl := envoyRun(t, r, ModeFloorExtProc)
	fl.RPS, fl.P99 = 1100, 4*time.Millisecond
	tg := target(t, r, TargetEnvoyExtProc)
	if tg.Status != Met || tg.Measured != "0.91× the calls/s (1000, the floor's 1100)" || tg.Threshold != "≥ 0.90× the ext_authz + ext_proc floor's calls/s" {
		t.Errorf("met: %+v", tg)
	}
	mustContain(t, markdown(t, r),
		"### capsnap against each floor",
		"| "+ModeFloor+" | 1250 | 2.00 ms | 5.00 ms | 0.80× | +1.00 ms | +0 |",
		"| "+ModeFloorExtProc+" | 1100 | 2.50 ms | 4.00 ms | 0.91× | +500 µs | +1.00 ms |",
		"capsnap makes 0.80× the floor's calls/s: 0.88× for the transport", "times 0.91× for capsnap's own work",
		"| ext_authz + ext_proc → floor | 1100 | 2.50 ms | 4.00 ms |", // in the table of every mode
	)
	// Its ratio on the line is met, a hair under it missed, and it shows
	// the digits that decide it.
	fl.RPS = 1000 / MinEnvoyExtProcRatio
	if tg := target(t, r, TargetEnvoyExtProc); tg.Status != Met {
		t.Errorf("on the line: %+v", tg)
	}
	fl.RPS = 1000/MinEnvoyExtProcRatio + 2
	if tg := target(t, r, TargetEnvoyExtProc); tg.Status != Missed || !strings.HasPrefix(tg.Measured, "0.898× the calls/s") {
		t.Errorf("under the line: %+v", tg)
	}
	mustContain(t, markdown(t, r), "| "+ModeFloorExtProc+" | 1113 | 2.50 ms | 4.00 ms | 0.898× |", "times 0.898× for capsnap's own work")
	// A run without the second floor judges nothing against it, and says
	// so where its figures would be.
	r.Envoy = slices.DeleteFunc(r.Envoy, func(e EnvoyRun) bool { return e.Mode == ModeFloorExtProc })
	if tg := target(t, r, TargetEnvoyExtProc); tg.Status != NotRun {
		t.Errorf("without the second floor: %+v", tg)
	}
	mustContain(t, markdown(t, r),
		"| "+ModeFloorExtProc+" | not run |  |  |  |  |  |",
		"The ext_proc floor did not run: capsnap's 0.80× of the floor's calls/s is its own work and the response path's transport together.",
	)
}

// target is r's target id, evaluated.
func target(t *testing.T, r *Results, id string) Target {
	t.Helper()
	for _, tg := range Evaluate(r) {
		if tg.ID == id {
			return tg
		}
	}
	t.Fatalf("no target %s", id)
	return Target{}
}

func TestEvaluateNothingRan(t *testing.T) {
	for _, tg := range Evaluate(&Results{}) {
		if tg.Status != NotRun {
			t.Errorf("%s: %s, want NOT RUN", tg.ID, tg.Status)
		}
	}
}

func TestMarkdown(t *testing.T) {
	r := sample()
	r.Targets = Evaluate(r)
	r.Targets[2].Profile = &Profile{What: "CPU profile:", Command: "go test", Top: "flat flat%"}
	r.Live = []LiveProfile{{Concurrency: 64, CPUBreakdown: []CPUPart{
		{Part: "the decision", Capsnap: 30 * time.Microsecond},
		{Part: "decoding the request", Capsnap: 20 * time.Microsecond, Floor: 25 * time.Microsecond},
	}}}
	md := markdown(t, r)
	for _, want := range []string{
		"# Benchmarks", "| CPU | Test CPU |", "**MISSED**", "**NOT RUN**",
		"| 16 | 900 | 1000 | 300 | 0.90× |", // throughput, side by side
		"| ext_authz → capsnap | 1000 | 3.00 ms | 5.00 ms |",
		"+2.00 ms",                              // added p50 over no ext_authz
		"| 1000000 | not run |",                 // the million snapshots
		"$ go test\nflat flat%", "`make bench`", // the profile, and how to rerun
		"## Levers examined (issue 17)", "| did not pay |",
		"| the decision | 30 µs | 0 | 30 µs |", "| decoding the request | 20 µs | 25 µs | −5.00 µs |", "| all | 50 µs | 25 µs | 25 µs |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("BENCHMARKS.md lacks %q", want)
		}
	}
}

func TestDur(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0", 42: "42 ns", 4450: "4.45 µs", 265 * time.Microsecond: "265 µs",
		8940 * time.Microsecond: "8.94 ms", 117 * time.Millisecond: "117.0 ms", 4467 * time.Millisecond: "4.47 s",
	} {
		if got := Dur(d); got != want {
			t.Errorf("Dur(%v) = %q, want %q", d, got, want)
		}
	}
}

// delivery is a response-path run: 12 of 225 tools delivered, the list
// 18 times smaller, 0.6 ms added at p50.
func delivery() Delivery {
	return Delivery{
		Principal: "spiffe://acme/role/support", CatalogTools: 225, GrantedTools: 12,
		FilteredBytes: 4366, UnfilteredBytes: 79445, UpstreamBytes: 79445,
		Workers: 2, Warmup: 200, Listings: 2000, Turn: 15 * time.Second,
		Without: mcpload.Result{Calls: 2000, RPS: 200, P50: 4 * time.Millisecond, P90: 6 * time.Millisecond, P99: 9 * time.Millisecond},
		With:    mcpload.Result{Calls: 1990, RPS: 150, P50: 4600 * time.Microsecond, P90: 7 * time.Millisecond, P99: 12 * time.Millisecond},
	}
}

func TestDeliverySection(t *testing.T) {
	r := sample()
	r.Delivery = delivery()
	md := markdown(t, r)
	for _, want := range []string{
		"## tools/list through the response path",
		"`testbed/cmd/mcpfixture -mode json,tools=225`", "grants it 12", "`discovery: {bind: catalog}`",
		"| without the response path | 225 | 79,445 | 19,861 |",
		"| with the response path | 12 | 4,366 | 1,091 |",
		"5.5% of the bytes: 18.2× fewer, 75,079 bytes (≈ 18,769 tokens) less",
		"bytes ÷ 4",
		"2 workers", "200 discarded listings", "take turns, 4 each: A B C … C B A, 2 times over, each turn 500 listings or 15s",
		"| without the response path | 2000 | 200 | 4.00 ms | 6.00 ms | 9.00 ms |",
		"| with the response path | 1990 | 150 | 4.60 ms | 7.00 ms | 12.0 ms |",
		"| +600 µs | +3.00 ms |",
		"≤ 1.00 ms. This run: +600 µs (p50 4.60 ms with, 4.00 ms without), **MET**.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("BENCHMARKS.md lacks %q", want)
		}
	}
	if tg := target(t, r, TargetDelivery); tg.Status != Met {
		t.Errorf("delivery: %+v", tg)
	}
	if md := markdown(t, sample()); !strings.Contains(md, "## tools/list through the response path\n\nNot run.\n") {
		t.Error("a run without the delivery step does not say so")
	}
}

// Each process's CPU per listing is tabled, with what the response path
// adds to each; no table without the figures.
func TestDeliveryCPU(t *testing.T) {
	r := sample()
	r.Delivery = delivery()
	cpu := func(envoy, capsnap, fixture, load time.Duration) []ProcessCPU {
		return []ProcessCPU{{Process: "Envoy", PerCall: envoy}, {Process: "capsnap", PerCall: capsnap},
			{Process: "mcpfixture", PerCall: fixture}, {Process: "the load", PerCall: load}}
	}
	r.Delivery.WithoutCPU = cpu(800*time.Microsecond, 750*time.Microsecond, 3200*time.Microsecond, 1500*time.Microsecond)
	r.Delivery.WithCPU = cpu(1300*time.Microsecond, 2100*time.Microsecond, 3500*time.Microsecond, 400*time.Microsecond)
	mustContain(t, markdown(t, r),
		"### Where a listing's CPU goes",
		"| mode | Envoy | capsnap | mcpfixture | the load | all |",
		"| without the response path | 800 µs | 750 µs | 3.20 ms | 1.50 ms | 6.25 ms |",
		"| with the response path | 1.30 ms | 2.10 ms | 3.50 ms | 400 µs | 7.30 ms |",
		"| added by the response path | +500 µs | +1.35 ms | +300 µs | −1.10 ms | +1.05 ms |",
	)
	r.Delivery.WithCPU = nil
	if md := markdown(t, r); strings.Contains(md, "Where a listing's CPU goes") {
		t.Error("a CPU table without the figures of both Envoys")
	}
}

// A call's CPU through Envoy is tabled by process for each mode, a
// process a mode does not run shown as a dash, and capsnap's cost over
// the floor's given by process.
func TestEnvoyCPU(t *testing.T) {
	r := sample()
	byProcess := map[string][]ProcessCPU{
		ModeNone: {{Process: "Envoy", PerCall: 200 * time.Microsecond}, {Process: "billing", PerCall: 450 * time.Microsecond},
			{Process: "the load", PerCall: 220 * time.Microsecond}},
		ModeFloor: {{Process: "Envoy", PerCall: 330 * time.Microsecond}, {Process: "billing", PerCall: 470 * time.Microsecond},
			{Process: "the authorizer", PerCall: 110 * time.Microsecond}, {Process: "the load", PerCall: 230 * time.Microsecond}},
		ModeFloorExtProc: {{Process: "Envoy", PerCall: 370 * time.Microsecond}, {Process: "billing", PerCall: 465 * time.Microsecond},
			{Process: "the authorizer", PerCall: 130 * time.Microsecond}, {Process: "the load", PerCall: 235 * time.Microsecond}},
		ModeCapsnap: {{Process: "Envoy", PerCall: 390 * time.Microsecond}, {Process: "billing", PerCall: 460 * time.Microsecond},
			{Process: "the authorizer", PerCall: 160 * time.Microsecond}, {Process: "the load", PerCall: 240 * time.Microsecond}},
	}
	for i := range r.Envoy {
		r.Envoy[i].CPU = byProcess[r.Envoy[i].Mode]
	}
	mustContain(t, markdown(t, r),
		"### Where a call's CPU goes",
		"| mode | Envoy | billing | the authorizer | the load | all |",
		"| "+ModeNone+" | 200 µs | 450 µs | – | 220 µs | 870 µs |",
		"| "+ModeCapsnap+" | 390 µs | 460 µs | 160 µs | 240 µs | 1.25 ms |",
		"| capsnap − floor | +60 µs | −10 µs | +50 µs | +10 µs | +110 µs |",
		"| ext_proc floor − floor | +40 µs | −5.00 µs | +20 µs | +5.00 µs | +60 µs |",
		"| capsnap − ext_proc floor | +20 µs | −5.00 µs | +30 µs | +5.00 µs | +50 µs |",
	)
	if md := markdown(t, sample()); strings.Contains(md, "Where a call's CPU goes") {
		t.Error("a CPU table without figures")
	}
}

func TestDeliveryTarget(t *testing.T) {
	d := delivery()
	if tg := DeliveryTarget(d); tg.Status != Met || !strings.Contains(tg.Name, "225-tool catalog") {
		t.Errorf("%+v", tg)
	}
	d.With.P50 = d.Without.P50 + MaxAddedListingP50 + time.Microsecond
	if tg := DeliveryTarget(d); tg.Status != Missed || !strings.HasPrefix(tg.Measured, "+1.00 ms") {
		t.Errorf("%+v", tg)
	}
	if tg := DeliveryTarget(Delivery{}); tg.Status != NotRun {
		t.Errorf("%+v", tg)
	}
}

// withStore adds the shared store's figures to a sample run.
func withStore(r *Results) *Results {
	bench := func(name string, metrics map[string]float64) gobench.Result {
		return gobench.Result{Pkg: "github.com/capsnap/capsnap/decide", Name: name, Metrics: metrics}
	}
	r.Store.Bench = []gobench.Result{
		bench("BenchmarkCheckStore/memory", map[string]float64{"ns/op": 10_000, "B/op": 2000, "allocs/op": 22}),
		bench("BenchmarkCheckStore/redis", map[string]float64{"ns/op": 90_000, "B/op": 3000, "allocs/op": 48}),
		bench("BenchmarkCheckStore/memory_apart", map[string]float64{"ns/op": 19_000, "B/op": 2010, "allocs/op": 22}),
		bench("BenchmarkCheckStore/memory_fresh", map[string]float64{"ns/op": 20_000, "B/op": 2050, "allocs/op": 22}),
		bench("BenchmarkCheckStore/redis_other_replica", map[string]float64{"ns/op": 400_000, "B/op": 8100, "allocs/op": 100}),
		bench("BenchmarkSnapshotsRedis/snapshots=10000", map[string]float64{"ns/op": 110_000, "redis-B/snapshot": 1028,
			"snapshot-key-B": 712, "pointer-key-B": 184, "record-B": 619, "pins/snapshot": 2}),
	}
	r.Envoy = append(r.Envoy,
		EnvoyRun{Mode: ModeRedis, Result: mcpload.Result{Calls: 80, RPS: 800, P50: 4 * time.Millisecond, P99: 9 * time.Millisecond}},
		EnvoyRun{Mode: ModeReplicas, Result: mcpload.Result{Calls: 70, RPS: 700, P50: 5 * time.Millisecond, P99: 12 * time.Millisecond}},
	)
	r.Store.Invalidation = Invalidation{
		Trials: []Trial{{Variant: "description_edit", Elapsed: 12 * time.Millisecond, Written: 11 * time.Millisecond, Post: time.Millisecond, Polls: 20, Allowed: 19}},
		Min:    12 * time.Millisecond, P50: 12 * time.Millisecond, P99: 12 * time.Millisecond, Max: 12 * time.Millisecond,
	}
	r.Machine.Redis = "Redis 7.0.15"
	return r
}

func TestStoreSections(t *testing.T) {
	r := withStore(sample())
	md := markdown(t, r)
	for _, want := range []string{
		"## Shared snapshot store (issue 15): figures, no targets",
		"| the allowed Check on the Redis store, snapshot held | `BenchmarkCheckStore/redis`",
		"| 90 µs, 48 allocs (memory store: 10 µs, 22 allocs) |",
		"| 400 µs, 100 allocs (memory store, a new snapshot each Check: 20 µs, 22 allocs; timed the same way, a held one: 19 µs, 22 allocs) |",
		"| memory | held, the timer stopped and started before each Check, as below | 19 µs | 1.9× | 2010 | 22 | `memory_apart` |",
		"| 700 calls/s, p50 5.00 ms, p99 12.0 ms (one replica on Redis: 800 calls/s, p50 4.00 ms, p99 9.00 ms; one on the memory store: 1000 calls/s, p50 3.00 ms, p99 5.00 ms) |",
		"| p50 12.0 ms, p99 12.0 ms (max 12.0 ms, 1 trials) |", "1 trials, each: mint a snapshot on A",
		"| 1028 B/snapshot → 0.96 GiB per 1,000,000; one snapshot key 712 B, its pointer 184 B |",
		"| ext_authz → 2 capsnaps on Redis | 700 | 5.00 ms | 12.0 ms |", // in the Envoy table too
		"## Shared snapshot store (Redis)", "real Redis 7.0.15 on loopback",
		"| Redis | held: minted by this replica, or read before | 90 µs | 9.0× | 3000 | 48 | `redis` |",
		"| Redis | new for each Check, minted by another replica: first use here | 400 µs | 40.0× | 8100 | 100 | `redis_other_replica` |",
		"| two replicas, one Redis | 700 | 0.70× | 5.00 ms | +2.00 ms | 12.0 ms | 70 |",
		"| 1 | 12.0 ms | 11.0 ms | 1.00 ms | 20 | 19 |",
		"| 10,000 | 1028 B | 0.96 GiB | 712 B | 184 B | 619 B | 2 | 110 µs |",
		"**Shared snapshot store.**", "| Redis | Redis 7.0.15 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("BENCHMARKS.md lacks %q", want)
		}
	}
	// Figures, not targets, but the Redis memory is stated under memory.
	if tg := target(t, r, TargetMemory); !strings.Contains(tg.Measured, "Redis: 1028 B/snapshot → 0.96 GiB") {
		t.Errorf("memory: %+v", tg)
	}
	md = markdown(t, sample())
	if strings.Contains(md, ModeRedis) || !strings.Contains(md, "| the allowed Check on the Redis store, snapshot held |") ||
		!strings.Contains(md, "not run (memory store: not run)") {
		t.Error("a run without the shared store's steps does not say so")
	}
}

func TestEnvelopeSection(t *testing.T) {
	r := sample()
	for _, c := range r.Method.Concurrencies {
		r.GRPC = append(r.GRPC, GRPCRun{Server: CapsnapEnvelope, Concurrency: c,
			Report: grpcload.Report{Count: 800, RPS: 800, P50: 150 * time.Microsecond, P99: 500 * time.Microsecond}, CPUPerCheck: 60 * time.Microsecond},
			GRPCRun{Server: CapsnapGrant, Concurrency: c,
				Report: grpcload.Report{Count: 850, RPS: 850, P50: 120 * time.Microsecond, P99: 450 * time.Microsecond}, CPUPerCheck: 30 * time.Microsecond})
	}
	bench := func(pkg, name string, metrics map[string]float64) gobench.Result {
		return gobench.Result{Pkg: "github.com/capsnap/capsnap/" + pkg, Name: name, Metrics: metrics}
	}
	r.HotPath = append(r.HotPath,
		bench("decide", BenchCheckEnvelopeOff, map[string]float64{"ns/op": 7000, "B/op": 2000, "allocs/op": 22}),
		bench("decide", BenchCheckEnvelopeOn, map[string]float64{"ns/op": 57000, "B/op": 12000, "allocs/op": 100}),
		bench("envelope", BenchSealSign, map[string]float64{"ns/op": 34000, "allocs/op": 0}),
		bench("envelope", BenchSeal, map[string]float64{"ns/op": 40000, "allocs/op": 61}),
		bench("envelope", BenchSealArgsDigest, map[string]float64{"ns/op": 4000, "allocs/op": 34}),
		bench("decide", BenchCheckGrant, map[string]float64{"ns/op": 12000, "B/op": 5000, "allocs/op": 60}),
		bench("envelope", BenchGrantMint, map[string]float64{"ns/op": 140000, "allocs/op": 235}),
		bench("envelope", BenchGrantSeal, map[string]float64{"ns/op": 2000, "allocs/op": 10}))
	r.EnvelopeHeaderBytes, r.GrantEnvelopeHeaderBytes, r.GrantHeaderBytes = 612, 280, 1100
	md := markdown(t, r)
	mustContain(t, md,
		"## Signed envelope (issue 16)",
		"| envelope off | 7.00 µs | 2000 | 22 |",
		"| envelope on | 57 µs | 12000 | 100 |",
		"| envelope on − off | +50 µs | +10000 | +78 |",
		"The envelope signed whole adds +50 µs and +78 allocations",
		"| under a grant | 12 µs | 5000 | 60 |",
		"| under a grant − off | +5.00 µs | +3000 | +38 |",
		"Under a grant it adds +5.00 µs (7.00 µs → 12 µs): sealing one call's envelope under its grant (`BenchmarkGrant/Seal`) is 2.00 µs, and minting the grant",
		"once per snapshot and tool, 140 µs.",
		"| the Ed25519 signature of the envelope (`BenchmarkSealParts/ed25519.Sign`) | 34 µs, 68% |",
		"| the rest of the seal: the claims' JSON encoding, the JWS header, base64url (`BenchmarkSealParts/Seal` less the signature) | 6.00 µs, 12% |",
		"The Ed25519 signature of each call's envelope is most of it (34 µs, 68%)",
		"| 16 | signed whole | 900 | 800 | 0.89× | 110 µs | 150 µs | +40 µs | 400 µs | 500 µs | +100 µs | 20 µs | 60 µs | +40 µs |",
		"| 16 | under a grant | 900 | 850 | 0.94× | 110 µs | 120 µs | +10 µs | 400 µs | 450 µs | +50 µs | 20 µs | 30 µs | +10 µs |",
		"signed whole, the envelope adds +40 µs at c=1, +40 µs at c=16, +40 µs at c=64 of server CPU per allowed Check, and capsnap with it makes 0.89× at c=1, 0.89× at c=16, 0.89× at c=64 the Checks per second it makes without; under a grant, the envelope adds +10 µs at c=1",
		"612 bytes of JWS in this run signed whole; under a grant, 280 bytes of envelope and 1,100 of grant.",
	)
	// The main tables stay capsnap, the floor and OPA.
	if strings.Contains(md, "| concurrency | capsnap | floor (noop) | OPA-Envoy | capsnap + envelope") {
		t.Error("the envelope's capsnap is in the main gRPC tables")
	}
	md = markdown(t, sample())
	if !strings.Contains(md, "### In process (`BenchmarkCheckEnvelope`, `decide`)\n\nNot run") || !strings.Contains(md, "### Over gRPC\n\nNot run.\n") {
		t.Error("a run without the envelope's figures does not say so")
	}
}

// markdown is BENCHMARKS.md of r.
func markdown(t *testing.T, r *Results) string {
	t.Helper()
	b, err := Markdown(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// mustContain fails t for each of wants that md lacks.
func mustContain(t *testing.T, md string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// ghz no longer runs, and the report says why the load is not ghz and
// why ghz is not run beside it.
func TestGhzSection(t *testing.T) {
	mustContain(t, markdown(t, sample()),
		"See [The load, and ghz](#the-load-and-ghz)", "### The load, and ghz", "it no longer runs", "shares the 2 cores")
}

func TestRatioText(t *testing.T) {
	for _, tt := range []struct {
		ratio, limit float64
		want         string
	}{
		{0.80, 0.85, "0.80"},
		{1.337, 1.2, "1.34"},
		{0.0992, 0.1, "0.099"},
		{0.1003, 0.1, "0.1003"},
		{0.1, 0.1, "0.1000"},
	} {
		if got := ratioText(tt.ratio, tt.limit); got != tt.want {
			t.Errorf("ratioText(%v, %v) = %s, want %s", tt.ratio, tt.limit, got, tt.want)
		}
	}
}
