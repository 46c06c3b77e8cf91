package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/capsnap/capsnap/bench/mcpload"
	"github.com/capsnap/capsnap/bench/report"
	"github.com/capsnap/capsnap/examples/billing"
	"github.com/capsnap/capsnap/testbed"
)

// A trial gives up on a drift denial after this long, or this many calls.
const (
	trialTimeout  = 5 * time.Second
	trialMaxPolls = 20_000
)

// invalidation times, through the real stack, a billing redeploy to the
// first call capsnap denies as drift.
func (h *harness) invalidation(ctx context.Context) error {
	h.results.Method.Trials = h.o.trials
	stack, err := h.startStack(ctx)
	if err != nil {
		return err
	}
	defer stack.Close()
	sess, err := mcpload.Open(ctx, stack.MCPURL(), map[string]string{testbed.PrincipalHeader: agent})
	if err != nil {
		return err
	}
	defer sess.Close()

	// Each trial changes refund's definition: away from the baseline and
	// back to it, in turn.
	variants := []string{billing.DescriptionEdit, billing.Baseline}
	return h.trials(&h.results.Invalidation, func(i int) (report.Trial, error) {
		return trial(ctx, stack, sess, variants[i%len(variants)])
	})
}

// trials runs the run's number of trials into inv, and sums them up.
func (h *harness) trials(inv *report.Invalidation, trial func(i int) (report.Trial, error)) error {
	for i := range h.o.trials {
		t, err := trial(i)
		if err != nil {
			return fmt.Errorf("trial %d: %w", i+1, err)
		}
		inv.Trials = append(inv.Trials, t)
	}
	summarizeTrials(inv)
	h.logf("   %d trials: p50 %s, p99 %s, max %s", len(inv.Trials), report.Dur(inv.P50), report.Dur(inv.P99), report.Dur(inv.Max))
	return nil
}

// startStack is testbed's stack (Envoy, capsnap, billing and payments),
// under the demo policy, its files in the work directory.
func (h *harness) startStack(ctx context.Context) (*testbed.Stack, error) {
	policy, err := os.ReadFile(demoPolicy)
	if err != nil {
		return nil, err
	}
	ports, err := testbed.RandomPorts()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(h.work, "stack")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return testbed.StartStack(ctx, testbed.StackOptions{
		Capsnap: h.capsnap, Billing: h.billing, Envoy: h.envoy, Ports: ports, Dir: dir, Policy: policy,
		SnapshotTTL: 30 * time.Minute,
	})
}

// trial mints a fresh snapshot and proves it allows a refund, then
// redeploys billing to variant and calls refund until capsnap denies it.
func trial(ctx context.Context, stack *testbed.Stack, sess *mcpload.Session, variant string) (report.Trial, error) {
	t := report.Trial{Variant: variant}
	if err := sess.List(ctx); err != nil {
		return t, err
	}
	for _, body := range []string{lookupBody, refundBody} {
		r, err := sess.Post(ctx, []byte(body))
		if err != nil {
			return t, err
		}
		if !r.OK() {
			return t, fmt.Errorf("before the redeploy: %s", r)
		}
	}
	redeploy := func() error { return stack.Redeploy(ctx, "billing", variant) }
	return t, awaitDrift(&t, redeploy, func(time.Time) (bool, error) {
		r, err := sess.Post(ctx, []byte(refundBody))
		if err != nil {
			return false, err
		}
		switch drift := r.Header.Get("x-capability-drift"); {
		case drift == "schema_drift":
			return true, nil
		case drift != "":
			return false, fmt.Errorf("drift denial %q, want schema_drift: %s", drift, r)
		case r.OK():
			t.Allowed++
		case r.Reason == "handler_drift":
			// capsnap had not yet seen the change; billing's own pin check
			// refused the call at handler start.
			t.HandlerDrift++
		default:
			return false, fmt.Errorf("after the redeploy: %s", r)
		}
		return false, nil
	})
}

// awaitDrift times a trial from just before redeploy to the first call
// that call reports denied as drift; it counts the calls, within
// trialMaxPolls and trialTimeout.
func awaitDrift(t *report.Trial, redeploy func() error, call func(start time.Time) (drift bool, err error)) error {
	start := time.Now()
	if err := redeploy(); err != nil {
		return err
	}
	t.Post = time.Since(start)
	for t.Polls < trialMaxPolls && time.Since(start) < trialTimeout {
		t.Polls++
		drift, err := call(start)
		if err != nil || drift {
			t.Elapsed = time.Since(start)
			return err
		}
	}
	return fmt.Errorf("no drift denial after %d calls in %v", t.Polls, time.Since(start).Round(time.Millisecond))
}

// summarizeTrials fills in inv's figures.
func summarizeTrials(inv *report.Invalidation) {
	var d []time.Duration
	for _, t := range inv.Trials {
		d = append(d, t.Elapsed)
	}
	slices.Sort(d)
	if len(d) == 0 {
		return
	}
	inv.Min, inv.Max = d[0], d[len(d)-1]
	inv.P50, inv.P99 = mcpload.Percentile(d, 50), mcpload.Percentile(d, 99)
}
