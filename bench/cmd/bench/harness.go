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

// options are the command line's.
type options struct {
	bin, peers, envoy string
	out, report, svg  string
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
	// Binaries, found by findBinaries.
	capsnap, billing, noop, mcpfixture, checkload, opaEnvoy, envoy, redis string
	procs                                                                 []*server
	results                                                               report.Results
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
	if err := checkRoot(); err != nil {
		return nil, err
	}
	h := &harness{o: o, started: time.Now(), logs: filepath.Join(o.out, "logs")}
	// Nothing of an earlier run may pass for this one's: capsnap appends
	// to its audit file, and a profile is only written for a miss.
	old, _ := filepath.Glob(filepath.Join(o.out, "*.pprof"))
	for _, p := range append(old, h.logs, filepath.Join(o.out, "results.json")) {
		if err := os.RemoveAll(p); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(h.logs, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "capsnap-bench-")
	if err != nil {
		return nil, err
	}
	h.work = work
	h.results.Started = h.started
	h.results.Method.Turns = turns
	return h, nil
}

// checkRoot makes sure the harness runs from capsnap's repository root,
// where every relative path it uses starts.
func checkRoot() error {
	b, err := os.ReadFile("go.mod")
	if err != nil || !bytes.HasPrefix(b, []byte("module github.com/capsnap/capsnap\n")) {
		return fmt.Errorf("run from capsnap's repository root (make bench does): no go.mod of github.com/capsnap/capsnap here")
	}
	return nil
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// server is a process the harness started, with its log file.
type server struct {
	*testbed.Process
	log string
}

// start runs bin, its output to a log file of its own (capsnap writes an
// audit line per request: too much to keep in memory).
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
	s := &server{Process: p, log: path}
	h.procs = append(h.procs, s)
	return s, nil
}

// cleanups are what a step undoes when it ends, the last first: stopping
// its servers, so that the next step has the machine to itself.
type cleanups []func()

func (c *cleanups) add(f func()) { *c = append(*c, f) }

func (c *cleanups) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}

// stop stops s now, rather than at the end of the run.
func (h *harness) stop(s *server) {
	_ = s.Stop()
	for i, p := range h.procs {
		if p == s {
			h.procs = append(h.procs[:i], h.procs[i+1:]...)
			break
		}
	}
}

// stopAll stops every process still running, the last started first,
// and removes the work directory.
func (h *harness) stopAll() {
	for i := len(h.procs) - 1; i >= 0; i-- {
		_ = h.procs[i].Stop()
	}
	h.procs = nil
	_ = os.RemoveAll(h.work)
}

// tail is the end of s's log, for an error message.
func (s *server) tail() string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return fmt.Sprintf("last lines of %s:\n%s", s.log, strings.Join(lines, "\n"))
}

// waitHTTP polls url until it answers 200; s exiting first is an error.
func (h *harness) waitHTTP(ctx context.Context, url string, s *server) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if err := s.gone(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s within %v; %s", s.Name, url, readyTimeout, s.tail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// gone is an error if s has exited.
func (s *server) gone() error {
	if s.Exited() {
		return fmt.Errorf("%s exited: %v; %s", s.Name, s.Stop(), s.tail())
	}
	return nil
}

func freeAddr() (string, error) {
	p, err := testbed.FreePort()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", p), nil
}

// saveResults writes results.json with whatever has been measured.
func (h *harness) saveResults() {
	h.results.Elapsed = time.Since(h.started)
	b, err := json.MarshalIndent(&h.results, "", "  ")
	if err == nil {
		err = os.WriteFile(filepath.Join(h.o.out, "results.json"), b, 0o644)
	}
	if err != nil {
		h.logf("could not save results: %v", err)
	}
}

// summary prints the targets' verdicts.
func (h *harness) summary() {
	w := bufio.NewWriter(os.Stderr)
	defer w.Flush()
	fmt.Fprintf(w, "bench: done in %v; wrote %s, %s and %s\n", time.Since(h.started).Round(time.Second),
		h.o.report, h.o.svg, filepath.Join(h.o.out, "results.json"))
	for _, t := range h.results.Targets {
		fmt.Fprintf(w, "  %-8s %s: %s\n", t.Status, t.Name, t.Measured)
	}
}
