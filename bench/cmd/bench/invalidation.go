package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/redis/rueidis"

	"github.com/capsnap/capsnap/bench/mcpload"
	"github.com/capsnap/capsnap/bench/report"
	"github.com/capsnap/capsnap/examples/billing"
	storekeys "github.com/capsnap/capsnap/store/redis"
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

// The shared snapshot store (issue 15): capsnap replicas sharing their
// snapshots, invalidations and sequence-rule records in Redis
// (store/redis, snapshots.store: redis).

// redisSnapshots is capsnap's snapshots section (a YAML flow mapping) for
// the store on the Redis at addr, its keys under prefix, and the secret
// every replica of the run shares. Its operation timeout is 1s, not the
// default 200ms: on a 2-core machine that other work may load, a Redis
// answer later than 200ms makes the store unavailable, and capsnap then
// denies every call (store_unavailable) until a probe succeeds, which
// fails the run; a figure within the timeout is the same either way.
func (h *harness) redisSnapshots(addr, prefix string) (string, error) {
	secret := filepath.Join(h.work, "snapshot.key")
	if _, err := os.Stat(secret); err != nil {
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		if err := os.WriteFile(secret, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("{ttl: 30m, store: redis, redis: {addr: %q, key_prefix: %q, secret_file: %q, timeout: 1s}}", addr, prefix, secret), nil
}

// replicaInvalidation times, across two capsnap replicas sharing a Redis,
// a billing redeploy that only replica A sees to the first call replica B
// denies as drift. B serves billing from a static catalog (the baseline's
// definitions, as e2e's TestReplicasShareInvalidations does): its own view
// never changes, and only the invalidation A writes to the store can deny.
// The calls go straight to each replica's gRPC Check, as in the Check over
// gRPC (no Envoy, no response path: the snapshot is minted at the
// tools/list Check).
func (h *harness) replicaInvalidation(ctx context.Context) error {
	_, addr, err := h.startRedis(ctx, "redis-invalidation")
	if err != nil {
		return err
	}
	rc, err := redisClient(addr)
	if err != nil {
		return err
	}
	h.later(rc.Close)
	_, billingURL, err := h.startBilling(ctx, "billing-replicas", false)
	if err != nil {
		return err
	}
	static, err := json.Marshal(map[string]any{"tools": billing.Definitions(billing.Baseline)})
	if err != nil {
		return err
	}
	staticFile := filepath.Join(h.work, "billing-static.json")
	if err := os.WriteFile(staticFile, static, 0o600); err != nil {
		return err
	}
	const prefix = "invalidation:"
	snapshots, err := h.redisSnapshots(addr, prefix)
	if err != nil {
		return err
	}
	var clients [2]authv3.AuthorizationClient
	for i, servers := range []string{"", fmt.Sprintf("servers:\n  - {id: billing, catalog_file: %q}\n", staticFile)} {
		cs, err := h.startCapsnap(ctx, capsnapSpec{
			name: "capsnap-replica-" + "ab"[i:i+1], billingURL: billingURL, principal: "{source: mtls}",
			servers: servers, snapshots: snapshots, extra: "discovery: {bind: catalog}\n",
		})
		if err != nil {
			return err
		}
		if clients[i], err = h.dialCheck(ctx, cs.grpcAddr, checkRequest(listBody, ""), cs.server); err != nil {
			return err
		}
	}
	seq := func() (uint64, error) { return storeSeq(ctx, rc, storekeys.Layout{Prefix: prefix}.Seq()) }
	return h.trials(&h.results.Store.Invalidation, func(int) (report.Trial, error) {
		return replicaTrial(ctx, clients[0], clients[1], billingURL, seq)
	})
}

// replicaTrial mints a snapshot on replica a and proves that replica b
// allows a refund under it, then redeploys billing to description_edit
// and calls refund on b until it denies it as drift; then it redeploys
// billing back to the baseline (b's static view) and waits until a has
// written that invalidation too, so that the next trial's snapshot pins
// refund after it.
func replicaTrial(ctx context.Context, a, b authv3.AuthorizationClient, billingURL string, seq func() (uint64, error)) (report.Trial, error) {
	t := report.Trial{Variant: billing.DescriptionEdit}
	before, err := seq()
	if err != nil {
		return t, err
	}
	epoch, err := mint(ctx, a)
	if err != nil {
		return t, fmt.Errorf("replica A: %w", err)
	}
	refund := checkRequest(refundBody, epoch)
	if err := checkOnce(ctx, b, refund); err != nil {
		return t, fmt.Errorf("replica B, before the redeploy: %w", err)
	}
	redeployed := func() error { return redeploy(ctx, billingURL, billing.DescriptionEdit) }
	err = awaitDrift(&t, redeployed, func(start time.Time) (bool, error) {
		if t.Written == 0 {
			n, err := seq()
			if err != nil {
				return false, err
			}
			if n > before {
				t.Written = time.Since(start)
			}
		}
		resp, err := b.Check(ctx, refund)
		if err != nil {
			return false, fmt.Errorf("replica B: %w", err)
		}
		switch reason := denialReason(resp); {
		case allowed(resp) == nil:
			t.Allowed++
			return false, nil
		case reason == "schema_drift" && strings.Contains(resp.GetDeniedResponse().GetBody(), "redefined after snapshot"):
			return true, nil
		}
		return false, fmt.Errorf("replica B, after the redeploy: %w, want schema_drift on the store's invalidation", allowed(resp))
	})
	if err != nil {
		return t, err
	}
	if t.Written == 0 {
		// It moved between the last read and the denying Check.
		t.Written = t.Elapsed
	}
	// Back to what B serves; A's invalidation of it is the next trial's
	// starting point.
	if err := redeploy(ctx, billingURL, billing.Baseline); err != nil {
		return t, err
	}
	for deadline := time.Now().Add(trialTimeout); ; time.Sleep(5 * time.Millisecond) {
		n, err := seq()
		if err != nil || n >= before+2 {
			return t, err
		}
		if time.Now().After(deadline) {
			return t, fmt.Errorf("replica A did not write the change back to the baseline within %v (sequence %d, from %d)", trialTimeout, n, before)
		}
	}
}

// storeSeq reads the store's invalidation sequence from Redis: store/redis
// keeps it under key as "<incarnation>.<n>.<mac>".
func storeSeq(ctx context.Context, c rueidis.Client, key string) (uint64, error) {
	raw, err := c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("redis GET %s: %w", key, err)
	}
	parts := strings.Split(raw, ".")
	if len(parts) != 4 {
		return 0, fmt.Errorf("redis %s = %q: not <incarnation>.<n>.<nonce>.<mac> (has store/redis's record changed?)", key, raw)
	}
	return strconv.ParseUint(parts[1], 10, 64)
}

// redeploy switches billing at url to variant (its POST /admin/variant),
// which makes it send notifications/tools/list_changed.
func redeploy(ctx context.Context, url, variant string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/admin/variant", strings.NewReader(variant))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("redeploy billing: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("redeploy billing to %q: %s: %s", variant, resp.Status, b)
	}
	return nil
}
