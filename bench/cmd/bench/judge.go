package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/capsnap/capsnap/bench/gobench"
	"github.com/capsnap/capsnap/bench/report"
)

// profileSpec is the Go benchmark that shows where a target's cost goes.
type profileSpec struct {
	what  string
	bench string // go test -bench pattern, in ./decide
	file  string // under the out directory
	// mem profiles allocations (-memprofile) instead of CPU time.
	mem bool
	// live takes the profiles of the running servers (liveProfile)
	// instead of a Go benchmark's: under the heaviest load, or alone.
	live, alone bool
	// listings takes the running capsnap's profile while it served
	// listings through the response path (profileListings).
	listings bool
}

var (
	checkProfile = profileSpec{
		what:  "CPU profile of one allowed Check (BenchmarkCheckAllowed, the same request as the gRPC cases), its top 20 functions:",
		bench: "^BenchmarkCheckAllowed$", file: "check.pprof",
	}
	// profiles maps each target to the benchmark profiled when it is
	// missed. Invalidation has none: no Go benchmark redeploys a server,
	// and its time is spent waiting on the network, which its per-trial
	// table breaks down.
	// The gRPC targets compare running servers, and their gap is
	// mostly outside what a Go benchmark runs.
	liveProfile = profileSpec{live: true}
	profiles    = map[string]profileSpec{
		report.TargetThroughput: liveProfile,
		report.TargetP99:        liveProfile,
		report.TargetCPU:        liveProfile,
		report.TargetCPUFloor:   {live: true, alone: true},
		// Through Envoy, capsnap's part is the Check the live profile
		// shows, under the gRPC load rather than Envoy.
		report.TargetEnvoy:  liveProfile,
		report.TargetBudget: checkProfile,
		report.TargetDeployed: {
			what:  "CPU profile of one allowed Check as deployed (BenchmarkCheckDeployed: Redis store, snapshot held, envelope under a grant), its top 20 functions:",
			bench: "^BenchmarkCheckDeployed$", file: "check-deployed.pprof",
		},
		report.TargetDelivery: {listings: true},
		report.TargetFlat: {
			what:  "CPU profile of the allowed Check against 100,000 tools, its top 20 functions:",
			bench: "^BenchmarkCheckCatalogSize$/^tools=100000$", file: "catalog-100000.pprof",
		},
		report.TargetMemory: {
			what:  "Allocation profile (alloc_space) of minting and holding a million snapshots, its top 20 functions:",
			bench: "^BenchmarkSnapshotsLive$/^snapshots=1000000$", file: "snapshots-1000000.mem.pprof", mem: true,
		},
	}
)

// judge evaluates the targets and profiles the gap of each one missed.
func (h *harness) judge(ctx context.Context) error {
	h.results.Targets = report.Evaluate(&h.results)
	done := map[string]*report.Profile{}
	for i := range h.results.Targets {
		t := &h.results.Targets[i]
		spec, ok := profiles[t.ID]
		if t.Status != report.Missed || !ok {
			continue
		}
		if spec.listings {
			t.Profile = h.results.Delivery.Profile
			continue
		}
		if spec.live {
			c := concurrencies[len(concurrencies)-1]
			if spec.alone {
				c = concurrencies[0]
			}
			if live := h.results.LiveAt(c); live != nil {
				t.Profile = live.Profile
			}
			continue
		}
		if p, ok := done[spec.file]; ok {
			t.Profile = p
			continue
		}
		h.logf("   %s missed: profiling %s", t.ID, spec.bench)
		p, err := h.profile(ctx, spec)
		if err != nil {
			return fmt.Errorf("profile for %s: %w", t.ID, err)
		}
		t.Profile, done[spec.file] = p, p
	}
	return nil
}

// profile runs spec's benchmark under the profiler and reads its top.
func (h *harness) profile(ctx context.Context, spec profileSpec) (*report.Profile, error) {
	file := filepath.Join(h.o.out, spec.file)
	binary := filepath.Join(h.o.out, "decide.test")
	flag := "-cpuprofile"
	if spec.mem {
		flag = "-memprofile"
	}
	run := gobench.Run{
		Dir: ".", Log: filepath.Join(h.logs, "go-bench-"+strings.TrimSuffix(spec.file, ".pprof")+".log"),
		Bench: spec.bench, Args: []string{"-benchtime", "3s", flag, file, "-o", binary, "-timeout", "20m"}, Pkgs: []string{"./decide"},
	}
	res, err := run.Do(ctx)
	if err != nil {
		return nil, err
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("%s matched no benchmark", spec.bench)
	}
	args := []string{"tool", "pprof", "-top", "-nodecount", "20"}
	if spec.mem {
		args = append(args, "-sample_index", "alloc_space")
	}
	args = append(args, binary, file)
	top, err := exec.CommandContext(ctx, "go", args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, top)
	}
	return &report.Profile{
		What:    spec.what,
		Command: run.String() + " && go " + strings.Join(args, " "),
		Top:     string(top),
	}, nil
}
