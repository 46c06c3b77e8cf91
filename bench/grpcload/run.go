package grpcload

import (
	"bytes"
	"context"
	"encoding/json"
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

// Do runs r and returns its report, with the load process's CPU time. A
// report with any error, denial or non-OK status is returned together
// with an error.
func (r Run) Do(ctx context.Context) (Report, error) {
	args := []string{"-data", r.Data, "-concurrency", strconv.Itoa(r.Concurrency), "-total", strconv.Itoa(r.Total), "-timeout", Timeout.String(), r.Target}
	ctx, cancel := context.WithTimeout(ctx, r.Deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.Bin, args...)
	// Killed, it may leave a child holding its output open: stop waiting.
	cmd.WaitDelay = time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%d requests not done within %v: %w", r.Total, r.Deadline, ctx.Err())
		}
		return Report{}, fmt.Errorf("%s %s: %w: %s", filepath.Base(r.Bin), strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	var res Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return Report{}, fmt.Errorf("load result: %w", err)
	}
	rep := res.Report()
	rep.ClientCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	if rep.Count != r.Total {
		return rep, fmt.Errorf("checkload made %d of %d requests", rep.Count, r.Total)
	}
	return rep, rep.Failed()
}
