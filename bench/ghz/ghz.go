// Package ghz runs the ghz gRPC load tool against an ext_authz server and
// reads its JSON report.
package ghz

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Run is one ghz run.
type Run struct {
	// Bin is the ghz binary; Protoset and Data are files (Protoset's
	// output, and the request as protojson).
	Bin, Protoset, Data string
	// Target is the server's host:port.
	Target string
	// Concurrency is the number of requests in flight, on one connection.
	Concurrency int
	// Total bounds the run by count, Deadline by time. ghz v0.93.0
	// cannot bound both (its -x, like -z, drops --total), so ghz counts
	// and a run still going at Deadline is killed: an error, never a
	// shorter run.
	Total    int
	Deadline time.Duration
}

// args are ghz's command line for r.
func (r Run) args() []string {
	return []string{
		"--insecure",
		"--protoset", r.Protoset,
		"--call", Call,
		"--data-file", r.Data,
		"--concurrency", strconv.Itoa(r.Concurrency),
		"--total", strconv.Itoa(r.Total),
		// A Check takes microseconds; a stuck one is an error.
		"--timeout", "5s",
		"--format", "json",
		r.Target,
	}
}

// Do runs r and returns its report. A report with any error or non-OK
// status is returned together with an error.
func (r Run) Do(ctx context.Context) (Report, error) {
	ctx, cancel := context.WithTimeout(ctx, r.Deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.Bin, r.args()...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%d requests not done within %v: %w", r.Total, r.Deadline, ctx.Err())
		}
		return Report{}, fmt.Errorf("ghz %s: %w: %s", strings.Join(r.args(), " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	rep, err := Parse(stdout.Bytes())
	if err != nil {
		return rep, err
	}
	return rep, rep.Failed()
}

// Report is what make bench keeps of a ghz report.
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
	// latencies are every request's, from the report's details, sorted:
	// what Merge needs to take percentiles over several runs.
	latencies []time.Duration
}

// raw is the part of ghz's --format json report that Parse reads.
type raw struct {
	Count     uint64         `json:"count"`
	Total     time.Duration  `json:"total"`
	Average   time.Duration  `json:"average"`
	Slowest   time.Duration  `json:"slowest"`
	Rps       float64        `json:"rps"`
	ErrorDist map[string]int `json:"errorDistribution"`
	Status    map[string]int `json:"statusCodeDistribution"`
	Latency   []struct {
		Percentage int           `json:"percentage"`
		Latency    time.Duration `json:"latency"`
	} `json:"latencyDistribution"`
	Details []struct {
		Latency time.Duration `json:"latency"`
	} `json:"details"`
}

// Parse reads a ghz --format json report.
func Parse(b []byte) (Report, error) {
	var r raw
	if err := json.Unmarshal(b, &r); err != nil {
		return Report{}, fmt.Errorf("ghz report: %w", err)
	}
	rep := Report{
		Count: int(r.Count), RPS: r.Rps, Mean: r.Average, Slowest: r.Slowest, Total: r.Total,
		Errors: r.ErrorDist, StatusCode: r.Status,
	}
	found := 0
	for _, l := range r.Latency {
		switch l.Percentage {
		case 50:
			rep.P50, found = l.Latency, found+1
		case 99:
			rep.P99, found = l.Latency, found+1
		}
	}
	if r.Count > 0 && found != 2 {
		return rep, fmt.Errorf("ghz report: no p50 and p99 in its latency distribution")
	}
	// ghz keeps the details of its first million requests; runs here are
	// smaller, so every request is in them.
	if len(r.Details) != int(r.Count) {
		return rep, fmt.Errorf("ghz report: %d requests but %d details", r.Count, len(r.Details))
	}
	rep.latencies = make([]time.Duration, len(r.Details))
	for i, d := range r.Details {
		rep.latencies[i] = d.Latency
	}
	slices.Sort(rep.latencies)
	return rep, nil
}

// Merge is one report of several runs of the same load: their requests
// over their time, and percentiles over all their latencies.
func Merge(reps ...Report) Report {
	m := Report{Errors: map[string]int{}, StatusCode: map[string]int{}}
	for _, r := range reps {
		m.Count += r.Count
		m.Total += r.Total
		m.Slowest = max(m.Slowest, r.Slowest)
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
	slices.Sort(m.latencies)
	if n := len(m.latencies); n > 0 {
		var sum time.Duration
		for _, d := range m.latencies {
			sum += d
		}
		m.Mean = sum / time.Duration(n)
		m.P50, m.P99 = percentile(m.latencies, 50), percentile(m.latencies, 99)
	}
	return m
}

// percentile is the nearest rank, as ghz takes its own.
func percentile(sorted []time.Duration, p int) time.Duration {
	rank := (len(sorted)*p+99)/100 - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

// Failed is an error if the run made no request, or if any request
// failed or ended with a status other than OK: the benchmark measures
// allowed Checks only.
func (r Report) Failed() error {
	if r.Count == 0 {
		return fmt.Errorf("ghz: no request was made")
	}
	var bad []string
	for msg, n := range r.Errors {
		bad = append(bad, fmt.Sprintf("%d× error %q", n, msg))
	}
	for code, n := range r.StatusCode {
		if code != "OK" {
			bad = append(bad, fmt.Sprintf("%d× status %s", n, code))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("ghz: %d requests, of which failed: %s", r.Count, strings.Join(bad, "; "))
	}
	if r.StatusCode["OK"] != r.Count {
		return fmt.Errorf("ghz: %d requests but %d OK", r.Count, r.StatusCode["OK"])
	}
	return nil
}
