package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/capsnap/capsnap/bench/report"
	"github.com/capsnap/capsnap/testbed"
)

// Where the harness writes: the report, its chart, and the raw results,
// logs and profiles of the run (not committed).
const reportFile, chartFile, outDir = "BENCHMARKS.md", "docs/benchmarks-latency.svg", "bench/out"

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

// write writes results.json, BENCHMARKS.md and the latency chart.
func (h *harness) write(context.Context) error {
	if err := h.saveResults(); err != nil {
		return err
	}
	svg, err := report.SVG(&h.results)
	if err != nil {
		return err
	}
	md, err := report.Markdown(&h.results, chartFile)
	if err != nil {
		return err
	}
	if err := os.WriteFile(chartFile, svg, 0o644); err != nil {
		return err
	}
	return os.WriteFile(reportFile, md, 0o644)
}

// summary prints the targets' verdicts.
func (h *harness) summary() {
	w := bufio.NewWriter(os.Stderr)
	defer w.Flush()
	fmt.Fprintf(w, "bench: done in %v; wrote %s, %s and %s\n", time.Since(h.started).Round(time.Second), reportFile, chartFile, outPath("results.json"))
	for _, t := range h.results.Targets {
		fmt.Fprintf(w, "  %-8s %s: %s\n", t.Status, t.Name, t.Measured)
	}
}
