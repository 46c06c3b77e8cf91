// Command bench is make bench (issues 7 and 17): it measures capsnap against a
// do-nothing ext_authz server (the floor) and OPA-Envoy over gRPC; through
// the real Envoy against the floor, and against the floor behind both
// ext_authz and ext_proc, as capsnap runs; at scale and on invalidation.
// It judges the figures against their targets, measures what the response
// path delivers and adds to a tools/list (issue 17), and writes
// BENCHMARKS.md and bench/out/results.json.
//
// It runs from the repository root, on binaries the Makefile built, and
// fails with a clear message whenever a step cannot run: a missing peer,
// a server that is not ready, an unexpected denial. Every process it
// starts is stopped on the way out, on error and on Ctrl-C too.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory of the capsnap, billing, noop, mcpfixture and checkload binaries")
	flag.StringVar(&o.peers, "peers", "bin/peers", "directory of the opa_envoy binary")
	flag.DurationVar(&o.grpcRun, "grpc-run", 4*time.Second, "how long each measured gRPC load run should take")
	flag.DurationVar(&o.envoyRun, "envoy-run", 5*time.Second, "how long each measured run through Envoy takes at most")
	flag.IntVar(&o.trials, "trials", 20, "invalidation trials")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench: FAILED:", err)
		stop()
		os.Exit(1)
	}
}

// run is the whole benchmark, top down. Each step adds to h.results and
// stops what it started when it ends; only a run in which every step
// succeeded writes the report.
func run(ctx context.Context, o options) error {
	h, err := newHarness(o)
	if err != nil {
		return err
	}
	defer os.RemoveAll(h.work)
	steps := []struct {
		name string
		do   func(context.Context) error
	}{
		{"find binaries and peers", h.findBinaries},
		{"describe the machine", h.describeMachine},
		{"Check over gRPC: capsnap, floor, OPA-Envoy, capsnap + envelope", h.checkOverGRPC},
		{"MCP tools/call through Envoy", h.throughEnvoy},
		{"tools/list through the response path: bytes and latency", h.delivery},
		{"scale: catalog sizes and live snapshots", h.scale},
		{"hot path Go benchmarks", h.hotPath},
		{"invalidation through Envoy", h.invalidation},
		{"shared store: the Check on Redis, Redis memory per snapshot", h.storeBenchmarks},
		{"shared store: invalidation across two replicas", h.replicaInvalidation},
		{"judge the targets, profile the misses", h.judge},
		{"write the report", h.write},
	}
	for i, s := range steps {
		h.logf("== step %d/%d: %s", i+1, len(steps), s.name)
		start := time.Now()
		err := func() error { defer h.scope()(); return s.do(ctx) }()
		if err == nil && ctx.Err() != nil {
			err = fmt.Errorf("interrupted: %w", ctx.Err())
		}
		if err != nil {
			// What was measured so far, for the post-mortem.
			if serr := h.saveResults(); serr != nil {
				h.logf("could not save results: %v", serr)
			}
			return fmt.Errorf("%s: %w", s.name, err)
		}
		h.logf("   done in %v", time.Since(start).Round(100*time.Millisecond))
	}
	h.summary()
	return nil
}
