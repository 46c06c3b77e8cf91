package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/capsnap/capsnap/bench/mcpload"
	"github.com/capsnap/capsnap/bench/proc"
	"github.com/capsnap/capsnap/bench/report"
)

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
	err := noDenials(ctx, capsnaps, func() (err error) {
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
