package mcpload

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// Load is one call posted by a fixed number of workers, each on its own
// session.
type Load struct {
	// URL is Envoy's route; Header is sent on every request.
	URL    string
	Header map[string]string
	// Setup is sent once on each session before the load (lookup_order,
	// which capsnap's sequence rule wants before a refund); Call is the
	// call under load.
	Setup, Call []byte
	Workers     int
	// Warmup is run once, when the load starts, and discarded.
	Warmup time.Duration
}

// Runner is a started Load: its sessions are open and warm, and it
// measures in bounded stretches, so that loads of several servers can
// take turns.
type Runner struct {
	l        Load
	sessions []*Session
}

// Start opens the sessions, sends their Setup and warms up. Any failed
// call is an error: the benchmark measures successful calls only.
func (l Load) Start(ctx context.Context) (*Runner, error) {
	r := &Runner{l: l}
	for range l.Workers {
		s, err := Open(ctx, l.URL, l.Header)
		if err == nil {
			r.sessions = append(r.sessions, s)
			var reply Reply
			if reply, err = s.Post(ctx, l.Setup); err == nil && !reply.OK() {
				err = fmt.Errorf("setup call: %s", reply)
			}
		}
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("open session: %w", err)
		}
	}
	if _, err := r.Measure(ctx, l.Warmup, math.MaxInt); err != nil {
		r.Close()
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	return r, nil
}

// Close ends the sessions' connections.
func (r *Runner) Close() {
	for _, s := range r.sessions {
		s.Close()
	}
}

// Sample is one measured stretch.
type Sample struct {
	Latencies []time.Duration
	Elapsed   time.Duration
}

// Measure has every worker post the call until d has passed or it made
// perWorker calls. A failed call is an error.
func (r *Runner) Measure(ctx context.Context, d time.Duration, perWorker int) (Sample, error) {
	made := make([]int, len(r.sessions))
	more := func(w int) bool { made[w]++; return made[w] <= perWorker }
	return Workers(ctx, len(r.sessions), d, more, func(w int) (time.Duration, error) {
		start := time.Now()
		reply, err := r.sessions[w].Post(ctx, r.l.Call)
		took := time.Since(start)
		if err == nil && !reply.OK() {
			err = fmt.Errorf("call: %s", reply)
		}
		return took, err
	})
}

// Workers times the calls of n workers at once: worker w calls call(w),
// which returns the time it measured, over and over until d has passed,
// more(w) is false or a call fails. Any failed call fails the sample.
func Workers(ctx context.Context, n int, d time.Duration, more func(w int) bool, call func(w int) (time.Duration, error)) (Sample, error) {
	var (
		mu     sync.Mutex
		sample Sample
		first  error
		wg     sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range n {
		wg.Go(func() {
			var own []time.Duration
			var err error
			for err == nil && more(w) && time.Now().Before(deadline) && ctx.Err() == nil {
				var took time.Duration
				if took, err = call(w); err == nil {
					own = append(own, took)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			sample.Latencies = append(sample.Latencies, own...)
			if first == nil {
				first = err
			}
		})
	}
	wg.Wait()
	sample.Elapsed = time.Since(start)
	switch {
	case ctx.Err() != nil:
		return sample, ctx.Err()
	case first != nil:
		return sample, first
	case len(sample.Latencies) == 0:
		return sample, fmt.Errorf("no call was made")
	}
	return sample, nil
}

// Result is the figures of one or more samples of the same load.
type Result struct {
	Calls   int           `json:"calls"`
	Elapsed time.Duration `json:"elapsed_ns"`
	RPS     float64       `json:"rps"`
	Mean    time.Duration `json:"mean_ns"`
	P50     time.Duration `json:"p50_ns"`
	P90     time.Duration `json:"p90_ns"`
	P99     time.Duration `json:"p99_ns"`
	Max     time.Duration `json:"max_ns"`
}

// Summarize merges samples into one result: their calls over their
// time, and the percentiles of all their latencies.
func Summarize(samples ...Sample) Result {
	var all []time.Duration
	var res Result
	for _, s := range samples {
		all = append(all, s.Latencies...)
		res.Elapsed += s.Elapsed
	}
	res.Calls = len(all)
	if res.Calls == 0 {
		return res
	}
	slices.Sort(all)
	var sum time.Duration
	for _, d := range all {
		sum += d
	}
	res.Mean = sum / time.Duration(len(all))
	res.P50, res.P90, res.P99, res.Max = Percentile(all, 50), Percentile(all, 90), Percentile(all, 99), all[len(all)-1]
	res.RPS = float64(len(all)) / res.Elapsed.Seconds()
	return res
}

// Percentile is the p-th percentile of sorted (nearest rank).
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}
