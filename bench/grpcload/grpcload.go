// Package grpcload is make bench's load on Envoy's ext_authz Check over
// gRPC: a fixed number of Checks kept in flight on one connection, each
// answer decoded in full by protobuf-go's generated code, as Envoy decodes
// it with its own. It runs as its own process (bench/cmd/checkload), so
// that its CPU is its own, and reports every request's latency.
//
// It replaced ghz as the load of the Check over gRPC (issue 17): ghz
// decodes each answer into a dynamic message, which costs it several
// times what the server spent answering, in proportion to the answer's
// fields rather than to the server's work.
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
	"sync"
	"sync/atomic"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/status"

	"github.com/capsnap/capsnap/bench/mcpload"
)

// Result is what one run measured, as the load process writes it for the
// harness: every request's latency, in the order they were started, the
// run's wall time, and its failures.
type Result struct {
	Total     time.Duration   `json:"total_ns"`
	Latencies []time.Duration `json:"latencies_ns"`
	// Errors counts requests that failed, by what went wrong; Codes
	// counts requests by their gRPC status.
	Errors map[string]int `json:"errors,omitempty"`
	Codes  map[string]int `json:"status_codes"`
}

// Denied is the error a Check answered with a denial counts under: make
// bench measures allowed Checks only.
const Denied = "the Check was denied"

// Generate sends req on client total times, concurrency at a time, each
// with timeout, and returns what it measured. It stops early, with what it
// has, when ctx ends.
func Generate(ctx context.Context, client authv3.AuthorizationClient, req *authv3.CheckRequest, concurrency, total int, timeout time.Duration) Result {
	lat := make([]time.Duration, total)
	codes := make([]string, total)
	failed := make([]string, total)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range min(concurrency, total) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= total {
					return
				}
				lat[i], codes[i], failed[i] = check(ctx, client, req, timeout)
			}
		})
	}
	wg.Wait()
	r := Result{Total: time.Since(start), Errors: map[string]int{}, Codes: map[string]int{}}
	for i := range min(int(next.Load()), total) {
		r.Latencies = append(r.Latencies, lat[i])
		r.Codes[codes[i]]++
		if failed[i] != "" {
			r.Errors[failed[i]]++
		}
	}
	if len(r.Errors) == 0 {
		r.Errors = nil
	}
	return r
}

// check makes one Check and returns its latency, its gRPC status and, if
// it failed or was denied, why.
func check(ctx context.Context, client authv3.AuthorizationClient, req *authv3.CheckRequest, timeout time.Duration) (time.Duration, string, string) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.Now()
	resp, err := client.Check(ctx, req)
	d := time.Since(t)
	switch {
	case err != nil:
		st := status.Convert(err)
		return d, st.Code().String(), st.Message()
	case resp.GetStatus().GetCode() != 0 || resp.GetDeniedResponse() != nil:
		// Envoy allows on an OK status; OPA-Envoy's allow sets no
		// ok_response when it has no headers to add.
		return d, "OK", Denied
	}
	return d, "OK", ""
}

// Report is what make bench keeps of one or several runs of the same load.
type Report struct {
	Count      int            `json:"count"`
	RPS        float64        `json:"rps"`
	Mean       time.Duration  `json:"mean_ns"`
	P50        time.Duration  `json:"p50_ns"`
	P99        time.Duration  `json:"p99_ns"`
	Slowest    time.Duration  `json:"slowest_ns"`
	Total      time.Duration  `json:"total_ns"`
	Errors     map[string]int `json:"errors,omitempty"`
	StatusCode map[string]int `json:"status_codes"`
	// ClientCPU is the CPU time the load process used, decoding every
	// answer included.
	ClientCPU time.Duration `json:"client_cpu_ns"`
	// latencies are every request's: what Merge needs to take
	// percentiles over several runs.
	latencies []time.Duration
}

// Report summarizes r.
func (r Result) Report() Report {
	// Merge copies the latencies.
	return Merge(Report{Count: len(r.Latencies), Total: r.Total, Errors: r.Errors, StatusCode: r.Codes, latencies: r.Latencies})
}

// Merge is one report of several runs of the same load: their requests
// over their time, and percentiles over all their latencies.
func Merge(reps ...Report) Report {
	m := Report{Errors: map[string]int{}, StatusCode: map[string]int{}}
	for _, r := range reps {
		m.Count += r.Count
		m.Total += r.Total
		m.ClientCPU += r.ClientCPU
		m.latencies = append(m.latencies, r.latencies...)
		for k, v := range r.Errors {
			m.Errors[k] += v
		}
		for k, v := range r.StatusCode {
			m.StatusCode[k] += v
		}
	}
	if len(m.Errors) == 0 {
		m.Errors = nil
	}
	if m.Total > 0 {
		m.RPS = float64(m.Count) / m.Total.Seconds()
	}
	if len(m.latencies) > 0 {
		// Its rate is not this load's: the requests overlap.
		s := mcpload.Summarize(mcpload.Sample{Latencies: m.latencies})
		m.Mean, m.P50, m.P99, m.Slowest = s.Mean, s.P50, s.P99, s.Max
	}
	return m
}

// ClientPerCheck is the load's CPU time per request, 0 if unknown.
func (r Report) ClientPerCheck() time.Duration {
	if r.Count == 0 {
		return 0
	}
	return r.ClientCPU / time.Duration(r.Count)
}

// Failed is an error if the run made no request, or if any request
// failed, was denied or ended with a status other than OK: the benchmark
// measures allowed Checks only.
func (r Report) Failed() error {
	switch {
	case r.Count == 0:
		return errors.New("no request was made")
	case len(r.Errors) > 0 || r.StatusCode["OK"] != r.Count:
		return fmt.Errorf("%d requests, of which failed: %v, by status: %v", r.Count, r.Errors, r.StatusCode)
	}
	return nil
}

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
