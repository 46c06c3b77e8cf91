package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/pprof/profile"

	"github.com/capsnap/capsnap/bench/gobench"
	"github.com/capsnap/capsnap/bench/grpcload"
	"github.com/capsnap/capsnap/bench/report"
)

// profileWindow is how long each live server is profiled, inside a load
// run that starts before it and outlasts it.
const profileWindow = 5 * time.Second

// benchProfile is the Go benchmark that shows where a target's cost goes.
type benchProfile struct {
	what  string
	bench string // go test -bench pattern, in ./decide
	file  string // under the out directory
	// mem profiles allocations (-memprofile) instead of CPU time.
	mem bool
}

// benchProfiles are the benchmarks profiled for the targets judged on Go
// benchmarks. The gRPC targets and the one through Envoy compare running
// servers, whose gap is mostly outside what a Go benchmark runs: theirs
// are the live profiles (liveProfile), the response path's its own
// (profileListings). Invalidation has none: no Go benchmark redeploys a
// server, and its time is spent waiting on the network, which its
// per-trial table breaks down.
var benchProfiles = map[string]benchProfile{
	report.TargetBudget: {
		what:  "CPU profile of one allowed Check (BenchmarkCheckAllowed, the same request as the gRPC cases), its top 20 functions:",
		bench: "^BenchmarkCheckAllowed$", file: "check.pprof",
	},
	report.TargetDeployed: {
		what:  "CPU profile of one allowed Check as deployed (BenchmarkCheckDeployed: Redis store, snapshot held, envelope under a grant), its top 20 functions:",
		bench: "^BenchmarkCheckDeployed$", file: "check-deployed.pprof",
	},
	report.TargetFlat: {
		what:  "CPU profile of the allowed Check against 100,000 tools, its top 20 functions:",
		bench: "^BenchmarkCheckCatalogSize$/^tools=100000$", file: "catalog-100000.pprof",
	},
	report.TargetMemory: {
		what:  "Allocation profile (alloc_space) of minting and holding a million snapshots, its top 20 functions:",
		bench: "^BenchmarkSnapshotsLive$/^snapshots=1000000$", file: "snapshots-1000000.mem.pprof", mem: true,
	},
}

// judge evaluates the targets and gives each one missed the profile of
// its gap.
func (h *harness) judge(ctx context.Context) error {
	h.results.Targets = report.Evaluate(&h.results)
	live := func(c int) *report.Profile {
		if l := h.results.LiveAt(c); l != nil {
			return l.Profile
		}
		return nil
	}
	for i := range h.results.Targets {
		t := &h.results.Targets[i]
		if t.Status != report.Missed {
			continue
		}
		switch spec, ok := benchProfiles[t.ID]; {
		case t.ID == report.TargetCPUFloor: // judged alone
			t.Profile = live(concurrencies[0])
		case slices.Contains([]string{report.TargetThroughput, report.TargetP99, report.TargetCPU, report.TargetEnvoy, report.TargetEnvoyExtProc}, t.ID):
			// Through Envoy, capsnap's part is the Check the live profile
			// shows, under the gRPC load rather than Envoy (its ext_proc
			// part, screening each answer, is not in it).
			t.Profile = live(concurrencies[len(concurrencies)-1])
		case t.ID == report.TargetDelivery:
			t.Profile = h.results.Delivery.Profile
		case ok:
			h.logf("   %s missed: profiling %s", t.ID, spec.bench)
			p, err := h.benchProfile(ctx, spec)
			if err != nil {
				return fmt.Errorf("profile for %s: %w", t.ID, err)
			}
			t.Profile = p
		}
	}
	return nil
}

// benchProfile runs spec's benchmark under the profiler and reads its top.
func (h *harness) benchProfile(ctx context.Context, spec benchProfile) (*report.Profile, error) {
	file, binary := outPath(spec.file), outPath("decide.test")
	flag := "-cpuprofile"
	if spec.mem {
		flag = "-memprofile"
	}
	run := h.goBench(strings.TrimSuffix(spec.file, ".pprof"), spec.bench, "", "./decide")
	run.Args = append([]string{"-benchtime", "3s", flag, file, "-o", binary}, run.Args...)
	res, err := run.Do(ctx)
	if err != nil {
		return nil, err
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("%s matched no benchmark", spec.bench)
	}
	args := []string{"-top", "-nodecount", "20"}
	if spec.mem {
		args = append(args, "-sample_index", "alloc_space")
	}
	args = append(args, binary, file)
	top, err := h.pprof(ctx, args...)
	return &report.Profile{What: spec.what, Command: run.String() + " && go tool pprof " + strings.Join(args, " "), Top: top}, err
}

// liveProfile profiles capsnap and the floor (net/http/pprof, CPU) while
// the load drives each at concurrency c: the gap between them as it
// arises in the running server, transport, audit writes and garbage
// collector included, which no in-process benchmark shows; and it breaks
// each one's CPU per Check into cpuParts. These runs are not measured;
// they come after the measured ones.
func (h *harness) liveProfile(ctx context.Context, targets []grpcTarget, c int) (*report.Profile, []report.CPUPart, error) {
	var what, top, cmds []string
	perCheck := map[string]map[string]time.Duration{}
	for _, t := range targets {
		if t.pprofURL == "" {
			continue
		}
		n, err := h.warmUp(ctx, t, c, 2*profileWindow)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", t.name, err)
		}
		file := outPath(fmt.Sprintf("live-%s-c%d.pprof", t.proc.Name, c))
		rep, err := profileDuring(ctx, h, t.pprofURL, file, func() (grpcload.Report, error) { return h.loadRun(t, c, n).Do(ctx) })
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", t.name, err)
		}
		args := []string{"-top", "-nodecount", "25", file}
		out, err := h.pprof(ctx, args...)
		if err != nil {
			return nil, nil, err
		}
		what = append(what, fmt.Sprintf("%s at %.0f Checks/s", t.name, rep.RPS))
		cmds = append(cmds, "go tool pprof "+strings.Join(args, " "))
		top = append(top, fmt.Sprintf("== %s (%.0f Checks/s while profiled)\n%s", t.name, rep.RPS, strings.TrimRight(out, "\n")))
		total, cum, err := cumulative(file)
		if err != nil {
			return nil, nil, err
		}
		perCheck[t.name] = split(total, cum, rep.RPS*profileWindow.Seconds())
	}
	var parts []report.CPUPart
	for _, p := range append(cpuParts, cpuPart{part: restPart}) {
		parts = append(parts, report.CPUPart{Part: p.part, Capsnap: perCheck[report.Capsnap][p.part], Floor: perCheck[report.Floor][p.part]})
	}
	return &report.Profile{
		What: fmt.Sprintf("CPU profiles of the running servers, %v each while the load drove them at concurrency %d (%s), top 25 functions of each. "+
			"Divide a function's time by the rate and the window for its cost per Check.", profileWindow, c, strings.Join(what, ", ")),
		Command: strings.Join(cmds, " && "),
		Top:     strings.Join(top, "\n\n"),
	}, parts, nil
}

// cpuPart is a part of a server's CPU time: the samples under fn, less
// those under less.
type cpuPart struct{ part, fn, less string }

const auditWrite = "github.com/capsnap/capsnap/audit.(*Writer).flush"

// cpuParts are disjoint: the decision (of which the audit line's write is
// split out) and the request's decoding and the response's encoding run
// one after another on the RPC's goroutine, the collector's background
// marking on its own.
var cpuParts = []cpuPart{
	{"the decision (extauthz.Server.Check), less the audit write", "github.com/capsnap/capsnap/extauthz.(*Server).Check", auditWrite},
	{"writing the audit line (audit.Writer's write(2), shared by the lines of concurrent Checks)", auditWrite, ""},
	{"reading and decoding the request (grpc serverStream.RecvMsg)", "google.golang.org/grpc.(*serverStream).RecvMsg", ""},
	{"encoding and sending the response (grpc serverStream.SendMsg)", "google.golang.org/grpc.(*serverStream).SendMsg", ""},
	{"the garbage collector's background marking", "runtime.gcBgMarkWorker", ""},
}

const restPart = "everything else: gRPC's HTTP/2 transport, the scheduler, system calls"

// split divides a profile's time among cpuParts and the rest, per Check
// of the checks made during it.
func split(total time.Duration, cum map[string]time.Duration, checks float64) map[string]time.Duration {
	out := map[string]time.Duration{}
	rest := total
	for _, p := range cpuParts {
		d := cum[p.fn] - cum[p.less]
		out[p.part] = time.Duration(float64(d) / checks)
		rest -= d
	}
	out[restPart] = time.Duration(float64(rest) / checks)
	return out
}

// cumulative reads a CPU profile: its total time, and each function's
// cumulative time, that of the samples with the function on their stack.
func cumulative(file string) (time.Duration, map[string]time.Duration, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, nil, err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", file, err)
	}
	i := slices.IndexFunc(p.SampleType, func(t *profile.ValueType) bool { return t.Type == "cpu" && t.Unit == "nanoseconds" })
	if i < 0 {
		return 0, nil, fmt.Errorf("%s: not a CPU profile", file)
	}
	var total time.Duration
	cum := map[string]time.Duration{}
	for _, s := range p.Sample {
		d := time.Duration(s.Value[i])
		total += d
		seen := map[string]bool{}
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				if !seen[l.Function.Name] {
					seen[l.Function.Name] = true
					cum[l.Function.Name] += d
				}
			}
		}
	}
	if total == 0 {
		return 0, nil, fmt.Errorf("%s: no samples", file)
	}
	return total, cum, nil
}

// profileDuring runs load, which must outlast the profile window by a
// quarter of it, and saves to file the CPU profile served at base, taken
// from a quarter window into it; it returns load's outcome.
func profileDuring[T any](ctx context.Context, h *harness, base, file string, load func() (T, error)) (T, error) {
	var v T
	var err error
	done := make(chan struct{})
	go func() { defer close(done); v, err = load() }()
	select {
	case <-time.After(profileWindow / 4):
	case <-done:
		return v, fmt.Errorf("the load ended before the profile began: %v", err)
	}
	_, perr := h.pprof(ctx, "-proto", "-output", file, "-seconds", fmt.Sprint(profileWindow.Seconds()), base+"/debug/pprof/profile")
	<-done
	if err != nil {
		return v, err
	}
	return v, perr
}

// pprof runs go tool pprof with args and returns its output; the copy it
// keeps of a profile it fetches goes into the work directory.
func (h *harness) pprof(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", append([]string{"tool", "pprof"}, args...)...)
	cmd.Env = append(os.Environ(), "PPROF_TMPDIR="+h.work)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go tool pprof %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func outPath(file string) string { return filepath.Join(outDir, file) }

// goBench is a go test run of the benchmarks bench matches, but those
// skip matches, in pkgs, its output logged as go-bench-log.log.
func (h *harness) goBench(log, bench, skip string, pkgs ...string) gobench.Run {
	return gobench.Run{Log: filepath.Join(h.logs, "go-bench-"+log+".log"), Bench: bench, Skip: skip, Args: []string{"-timeout", "20m"}, Pkgs: pkgs}
}

// scalePattern selects the scale benchmarks (decide/bench_test.go);
// the hot-path run skips them.
const scalePattern = "^(BenchmarkCheckCatalogSize|BenchmarkSnapshotsLive)$"

// scale runs the catalog-size and live-snapshot benchmarks. Either may
// not exist yet: then its targets are reported as not run.
func (h *harness) scale(ctx context.Context) error {
	res, err := h.goBench("scale", scalePattern, "", "./decide").Do(ctx)
	h.results.Scale = res
	h.logf("   %d scale results", len(res))
	return err
}

// hotPath runs every other Go benchmark of the module, but the shared
// store's (storeBenchmarks): whatever exists.
func (h *harness) hotPath(ctx context.Context) error {
	pkgs, err := benchmarkPackages(ctx)
	if err != nil {
		return err
	}
	if len(pkgs) == 0 {
		h.logf("   no package has a benchmark")
		return nil
	}
	res, err := h.goBench("hot-path", ".", scalePattern+"|"+storePattern, pkgs...).Do(ctx)
	h.results.HotPath = res
	h.logf("   %d results from %s", len(res), strings.Join(pkgs, " "))
	return err
}

// benchmarkPackages are the module's packages with a Benchmark function
// in a test file, the harness's own excepted.
func benchmarkPackages(ctx context.Context) ([]string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-f", "{{.Dir}}", "./...").Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	root, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	var pkgs []string
	for _, dir := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			return nil, err
		}
		has, err := hasBenchmark(dir)
		if err != nil {
			return nil, err
		}
		if has && rel != "bench" && !strings.HasPrefix(rel, "bench/") {
			pkgs = append(pkgs, "./"+rel)
		}
	}
	return pkgs, nil
}

// hasBenchmark is whether a test file in dir has a Benchmark function.
func hasBenchmark(dir string) (bool, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || bytes.HasPrefix(b, []byte("func Benchmark")) || bytes.Contains(b, []byte("\nfunc Benchmark")) {
			return err == nil, err
		}
	}
	return false, err
}

// storePattern selects the shared store's Go benchmarks
// (decide/store_bench_test.go); the hot-path run skips them.
const storePattern = "^(BenchmarkCheckStore|BenchmarkSnapshotsRedis)$"

// storeBenchmarks runs the shared store's Go benchmarks: the allowed Check
// on each store, and Redis's memory per snapshot. Each must have run: a
// Redis case skipped for want of a redis-server fails the step.
func (h *harness) storeBenchmarks(ctx context.Context) error {
	res, err := h.goBench("store", storePattern, "", "./decide").Do(ctx)
	if err != nil {
		return err
	}
	want := []string{fmt.Sprintf(report.BenchSnapshotsRedis, report.RedisSnapshots)}
	for _, c := range report.StoreCases {
		want = append(want, fmt.Sprintf(report.BenchCheckStore, c))
	}
	for _, name := range want {
		if _, ok := gobench.Find(res, name); !ok {
			return fmt.Errorf("%s did not run (skipped? see %s)", name, filepath.Join(h.logs, "go-bench-store.log"))
		}
	}
	h.results.Store.Bench = res
	for _, r := range res {
		h.logf("   %-55s %s", r.Name, report.Dur(time.Duration(r.Metrics["ns/op"])))
	}
	return nil
}
