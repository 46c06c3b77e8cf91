package main

import (
	"bufio"
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/prometheus/procfs"

	"github.com/capsnap/capsnap/bench/mcpload"
	"github.com/capsnap/capsnap/bench/proc"
	"github.com/capsnap/capsnap/bench/report"
	"github.com/capsnap/capsnap/testbed"
)

// Where the harness writes: the report, and the raw results, logs and
// profiles of the run (not committed).
const reportFile, outDir = "BENCHMARKS.md", "bench/out"

// options are the command line's.
type options struct {
	bin, peers        string
	grpcRun, envoyRun time.Duration
	trials            int
}

// harness is one run's state: where things are, what runs, what was
// measured.
type harness struct {
	o       options
	started time.Time
	// work holds generated configurations; logs every process's output.
	work, logs string
	// The binaries findBinaries found.
	capsnap, billing, noop, mcpfixture, checkload, opaEnvoy, envoy, redis string
	// undo stops the processes started and closes the connections made,
	// the last first.
	undo    []func()
	results report.Results
}

// readyTimeout bounds how long any server may take to become ready.
const readyTimeout = 30 * time.Second

// passes is how many times over the servers or modes of a step take
// their turns, each time in the order A B C, then C B A; turns is how
// many turns each gets. A spell of a busier or quieter machine shorter
// than the step then falls on all of them, not on the one or two whose
// turns it happened to span.
const (
	passes = 2
	turns  = 2 * passes
)

// turnOrder is the order in which n servers or modes take their turns:
// 0 1 … n-1, then n-1 … 1 0, passes times over.
func turnOrder(n int) []int {
	order := make([]int, 0, turns*n)
	for range passes {
		for i := range n {
			order = append(order, i)
		}
		for i := range n {
			order = append(order, n-1-i)
		}
	}
	return order
}

func newHarness(o options) (*harness, error) {
	if b, err := os.ReadFile("go.mod"); err != nil || !bytes.HasPrefix(b, []byte("module github.com/capsnap/capsnap\n")) {
		return nil, fmt.Errorf("run from capsnap's repository root (make bench does): no go.mod of github.com/capsnap/capsnap here")
	}
	h := &harness{o: o, started: time.Now(), logs: outPath("logs")}
	// Nothing of an earlier run may pass for this one's: capsnap appends
	// to its audit file, and a profile is only written for a miss.
	old, _ := filepath.Glob(outPath("*.pprof"))
	for _, p := range append(old, h.logs, outPath("results.json")) {
		if err := os.RemoveAll(p); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(h.logs, 0o755); err != nil {
		return nil, err
	}
	h.results.Started, h.results.Method.Turns = h.started, turns
	var err error
	h.work, err = os.MkdirTemp("", "capsnap-bench-")
	return h, err
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// later has f run when the step ends, before what was registered earlier.
func (h *harness) later(f func()) { h.undo = append(h.undo, f) }

// scope returns what ends everything started since: a step's processes
// stop when it ends, so that the next has the machine to itself.
func (h *harness) scope() func() {
	n := len(h.undo)
	return func() {
		for len(h.undo) > n {
			f := h.undo[len(h.undo)-1]
			h.undo = h.undo[:len(h.undo)-1]
			f()
		}
	}
}

// server is a process the harness started, with its log file.
type server struct {
	*testbed.Process
	log string
}

// start runs bin, its output to a log file of its own (capsnap writes an
// audit line per request: too much to keep in memory), until the step
// ends.
func (h *harness) start(name, bin string, args ...string) (*server, error) {
	path := filepath.Join(h.logs, name+".log")
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the child has its own copy of the descriptor
	p, err := testbed.StartTo(name, bin, args, f)
	if err != nil {
		return nil, err
	}
	h.later(func() { _ = p.Stop() })
	return &server{Process: p, log: path}, nil
}

// tail is the end of s's log, for an error message.
func (s *server) tail() string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return fmt.Sprintf("last lines of %s:\n%s", s.log, strings.Join(lines[max(len(lines)-15, 0):], "\n"))
}

// gone is an error if s has exited.
func (s *server) gone() error {
	if s.Exited() {
		return fmt.Errorf("%s exited: %v; %s", s.Name, s.Stop(), s.tail())
	}
	return nil
}

// await tries until try succeeds, which it must within readyTimeout and
// before s exits.
func (s *server) await(ctx context.Context, try func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		err := try(ctx)
		if err == nil {
			return nil
		}
		if err := s.gone(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready within %v: %w; %s", s.Name, readyTimeout, err, s.tail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// awaitHTTP waits until url answers 200.
func (s *server) awaitHTTP(ctx context.Context, url string) error {
	return s.await(ctx, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	})
}

func freeAddr() (string, error) {
	a, err := freeAddrs(1)
	return a[0], err
}

// freeAddrs are n free loopback addresses.
func freeAddrs(n int) ([]string, error) {
	addrs := make([]string, n)
	for i := range addrs {
		p, err := testbed.FreePort()
		if err != nil {
			return addrs, err
		}
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	return addrs, nil
}

// saveResults writes results.json with whatever has been measured.
func (h *harness) saveResults() error {
	h.results.Elapsed = time.Since(h.started)
	b, err := json.MarshalIndent(&h.results, "", "  ")
	if err == nil {
		err = os.WriteFile(outPath("results.json"), b, 0o644)
	}
	return err
}

// write writes results.json and BENCHMARKS.md.
func (h *harness) write(context.Context) error {
	if err := h.saveResults(); err != nil {
		return err
	}
	md, err := report.Markdown(&h.results)
	if err != nil {
		return err
	}
	return os.WriteFile(reportFile, md, 0o644)
}

// summary prints the targets' verdicts.
func (h *harness) summary() {
	w := bufio.NewWriter(os.Stderr)
	defer w.Flush()
	fmt.Fprintf(w, "bench: done in %v; wrote %s and %s\n", time.Since(h.started).Round(time.Second), reportFile, outPath("results.json"))
	for _, t := range h.results.Targets {
		fmt.Fprintf(w, "  %-8s %s: %s\n", t.Status, t.Name, t.Measured)
	}
}

// opaVersion is the OPA-Envoy the Makefile's peers target builds: another
// version's figures would not be the ones BENCHMARKS.md says they are.
const opaVersion = "1.15.2-envoy"

// findBinaries finds every binary the run needs, or says how to get it.
func (h *harness) findBinaries(context.Context) error {
	for _, b := range []struct {
		path *string
		file string
	}{
		{&h.capsnap, filepath.Join(h.o.bin, "capsnap")}, {&h.billing, filepath.Join(h.o.bin, "billing")},
		{&h.noop, filepath.Join(h.o.bin, "noop")}, {&h.mcpfixture, filepath.Join(h.o.bin, "mcpfixture")},
		{&h.checkload, filepath.Join(h.o.bin, "checkload")}, {&h.opaEnvoy, filepath.Join(h.o.peers, "opa_envoy")},
	} {
		abs, err := filepath.Abs(b.file)
		if err != nil {
			return err
		}
		if st, err := os.Stat(abs); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("missing %s (make bench builds it, and make peers OPA-Envoy)", abs)
		}
		*b.path = abs
	}
	if out, err := exec.Command(h.opaEnvoy, "version").Output(); err != nil || !strings.Contains(string(out), "Version: "+opaVersion+"\n") {
		return fmt.Errorf("%s is not opa-envoy-plugin %s (%v): run make peers", h.opaEnvoy, opaVersion, err)
	}
	var err error
	if h.envoy, err = testbed.FindEnvoy(); err != nil {
		return fmt.Errorf("%w (make envoy installs it)", err)
	}
	// redis-server as the tests find it, through $CAPSNAP_REDIS_SERVER
	// (make bench sets it), else on PATH; the variable is set for the go
	// test runs the harness starts.
	bin := os.Getenv(testbed.RedisServerEnv)
	if bin == "" {
		bin = "redis-server"
	}
	if h.redis, err = exec.LookPath(bin); err != nil {
		return fmt.Errorf("no redis-server (%v): make redis installs it", err)
	}
	if h.redis, err = filepath.Abs(h.redis); err != nil {
		return err
	}
	return os.Setenv(testbed.RedisServerEnv, h.redis)
}

func (h *harness) describeMachine(context.Context) error {
	envoyVersion, err := testbed.EnvoyVersion(h.envoy)
	if err != nil {
		return err
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	redis, _ := exec.Command(h.redis, "--version").Output()
	m := report.Machine{
		CPU: "?", Cores: runtime.NumCPU(), Kernel: strings.TrimSpace(string(kernel)), Go: runtime.Version(),
		Envoy: envoyRelease(envoyVersion), Redis: "?", Date: h.started.UTC().Format(time.RFC3339), LoadAvg: "?",
		OPA: fmt.Sprintf("opa-envoy-plugin %s (OPA %s)", opaVersion, depVersion(h.opaEnvoy, "github.com/open-policy-agent/opa")),
	}
	// "Redis server v=7.0.15 sha=…"
	for _, f := range strings.Fields(string(redis)) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			m.Redis = "Redis " + v
		}
	}
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if info, err := fs.CPUInfo(); err == nil && len(info) > 0 {
			m.CPU = info[0].ModelName
		}
		if l, err := fs.LoadAvg(); err == nil {
			m.LoadAvg = fmt.Sprintf("%.2f %.2f %.2f", l.Load1, l.Load5, l.Load15)
		}
	}
	h.results.Machine = m
	h.logf("   %s, %d cores, kernel %s, %s", m.CPU, m.Cores, m.Kernel, m.Go)
	return nil
}

// depVersion is the version of module dep inside bin.
func depVersion(bin, dep string) string {
	if info, err := buildinfo.ReadFile(bin); err == nil {
		for _, d := range info.Deps {
			if d.Path == dep {
				return d.Version
			}
		}
	}
	return "?"
}

// envoyRelease shortens Envoy's version line ("/path/to/envoy  version:
// <sha>/1.40.0/Clean/RELEASE/BoringSSL") to its release.
func envoyRelease(line string) string {
	_, v, ok := strings.Cut(line, "version: ")
	if parts := strings.Split(strings.TrimSpace(v), "/"); ok && len(parts) > 1 {
		return "Envoy " + parts[1]
	}
	return line
}

// process is one job in a measured turn, done by one process or several
// (two replicas): what a call's CPU is split by.
type process struct {
	name string
	pids []int
}

// theLoad is the harness's own process, whose clients make the calls.
func theLoad() process { return process{"the load", []int{os.Getpid()}} }

// cpuTally adds up what each of its processes spends over a mode's turns,
// and the calls the turns made.
type cpuTally struct {
	procs []process
	spent []time.Duration
	calls int
}

func newCPUTally(procs ...process) *cpuTally {
	return &cpuTally{procs: procs, spent: make([]time.Duration, len(procs))}
}

// during runs turn, which returns the calls it made, and adds what each
// process spent meanwhile.
func (t *cpuTally) during(turn func() (int, error)) error {
	before, err := t.read()
	if err != nil {
		return err
	}
	calls, err := turn()
	if err != nil {
		return err
	}
	after, err := t.read()
	if err != nil {
		return err
	}
	for i := range t.spent {
		t.spent[i] += after[i] - before[i]
	}
	t.calls += calls
	return nil
}

func (t *cpuTally) read() ([]time.Duration, error) {
	out := make([]time.Duration, len(t.procs))
	for i, p := range t.procs {
		for _, pid := range p.pids {
			cpu, err := proc.CPU(pid)
			if err != nil {
				return nil, fmt.Errorf("CPU of %s (pid %d): %w", p.name, pid, err)
			}
			out[i] += cpu
		}
	}
	return out, nil
}

// perCall is the tally as the report gives it; nil before any call.
func (t *cpuTally) perCall() []report.ProcessCPU {
	if t.calls == 0 {
		return nil
	}
	out := make([]report.ProcessCPU, len(t.procs))
	for i, p := range t.procs {
		out[i] = report.ProcessCPU{Process: p.name, CPU: t.spent[i], PerCall: t.spent[i] / time.Duration(t.calls)}
	}
	return out
}

// takeTurns measures contenders in turns (turnOrder), one measure(i) a
// turn, which returns what it measured and the calls it made, tallies[i]
// adding up what contender i's processes spend meanwhile; it returns each
// contender's turns.
func takeTurns[S any](tallies []*cpuTally, measure func(i int) (S, int, error)) ([][]S, error) {
	out := make([][]S, len(tallies))
	for _, i := range turnOrder(len(tallies)) {
		err := tallies[i].during(func() (int, error) {
			s, n, err := measure(i)
			out[i] = append(out[i], s)
			return n, err
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// callsInTurns has MCP loads take their turns (takeTurns), none of
// capsnaps denying a request meanwhile; measure(i) is load i's turn,
// through envoys[i], which must outlive it. It sums up each load's turns.
func callsInTurns(ctx context.Context, names []string, envoys []*server, tallies []*cpuTally, capsnaps []*capsnapServer, measure func(i int) (mcpload.Sample, error)) ([]mcpload.Result, error) {
	var samples [][]mcpload.Sample
	_, err := decided(ctx, capsnaps, func() (err error) {
		samples, err = takeTurns(tallies, func(i int) (mcpload.Sample, int, error) {
			s, err := measure(i)
			if err == nil {
				err = envoys[i].gone()
			}
			if err != nil {
				err = fmt.Errorf("%s: %w", names[i], err)
			}
			return s, len(s.Latencies), err
		})
		return err
	})
	results := make([]mcpload.Result, len(samples))
	for i, s := range samples {
		results[i] = mcpload.Summarize(s...)
	}
	return results, err
}
