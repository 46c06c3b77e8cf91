// Package ghz runs the ghz gRPC load tool against an ext_authz server and
// reads its JSON report: make bench's cross-check of its own load
// (package grpcload).
package ghz

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/capsnap/capsnap/bench/grpcload"
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
		"--timeout", grpcload.Timeout.String(),
		"--format", "json",
		r.Target,
	}
}

// Do runs r and returns its report, with ghz's own CPU time. A report
// with any error or non-OK status is returned together with an error.
func (r Run) Do(ctx context.Context) (grpcload.Report, error) {
	out, cpu, err := grpcload.Exec(ctx, r.Bin, r.args(), r.Total, r.Deadline)
	if err != nil {
		return grpcload.Report{}, err
	}
	rep, err := Parse(out)
	if err != nil {
		return rep, err
	}
	rep.ClientCPU = cpu
	return rep, rep.Failed()
}

// raw is the part of ghz's --format json report that Parse reads.
type raw struct {
	Count     uint64         `json:"count"`
	Total     time.Duration  `json:"total"`
	ErrorDist map[string]int `json:"errorDistribution"`
	Status    map[string]int `json:"statusCodeDistribution"`
	Details   []struct {
		Latency time.Duration `json:"latency"`
	} `json:"details"`
}

// Parse reads a ghz --format json report. Its percentiles are taken
// again from every request's latency, as the load's are.
func Parse(b []byte) (grpcload.Report, error) {
	var r raw
	if err := json.Unmarshal(b, &r); err != nil {
		return grpcload.Report{}, fmt.Errorf("ghz report: %w", err)
	}
	// ghz keeps the details of its first million requests; runs here are
	// smaller, so every request is in them.
	if len(r.Details) != int(r.Count) {
		return grpcload.Report{}, fmt.Errorf("ghz report: %d requests but %d details", r.Count, len(r.Details))
	}
	res := grpcload.Result{Total: r.Total, Errors: r.ErrorDist, Codes: r.Status, Latencies: make([]time.Duration, 0, len(r.Details))}
	for _, d := range r.Details {
		res.Latencies = append(res.Latencies, d.Latency)
	}
	return res.Report(), nil
}
