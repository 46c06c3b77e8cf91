package grpcload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Run is one run of the load process.
type Run struct {
	// Bin is the checkload binary; Data the request as protojson.
	Bin, Data string
	// Target is the server's host:port.
	Target string
	// Concurrency is the number of requests in flight, on one connection.
	Concurrency int
	// Total bounds the run by count, Deadline by time: a run still going
	// at Deadline is killed, an error, never a shorter run.
	Total    int
	Deadline time.Duration
}

// Timeout is each Check's: a Check takes microseconds, a stuck one is an
// error.
const Timeout = 5 * time.Second

// Args are checkload's command line for r.
func (r Run) Args() []string {
	return []string{
		"-data", r.Data,
		"-concurrency", strconv.Itoa(r.Concurrency),
		"-total", strconv.Itoa(r.Total),
		"-timeout", Timeout.String(),
		r.Target,
	}
}

// Do runs r and returns its report, with the load process's CPU time. A
// report with any error, denial or non-OK status is returned together
// with an error.
func (r Run) Do(ctx context.Context) (Report, error) {
	out, cpu, err := Exec(ctx, r.Bin, r.Args(), r.Total, r.Deadline)
	if err != nil {
		return Report{}, err
	}
	res, err := ParseResult(out)
	if err != nil {
		return Report{}, err
	}
	rep := res.Report()
	rep.ClientCPU = cpu
	if rep.Count != r.Total {
		return rep, fmt.Errorf("checkload made %d of %d requests", rep.Count, r.Total)
	}
	return rep, rep.Failed()
}

// Exec runs a load process, bin with args, to make total requests, and
// returns its standard output and the CPU time it used. A process still
// running at deadline is killed: an error, never a shorter run.
func Exec(ctx context.Context, bin string, args []string, total int, deadline time.Duration) ([]byte, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	// Killed, it may leave a child holding its output open: stop waiting.
	cmd.WaitDelay = time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%d requests not done within %v: %w", total, deadline, ctx.Err())
		}
		return nil, 0, fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
}
