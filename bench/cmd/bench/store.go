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
	"strconv"
	"strings"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/redis/rueidis"

	"github.com/capsnap/capsnap/bench/gobench"
	"github.com/capsnap/capsnap/bench/report"
	storekeys "github.com/capsnap/capsnap/cache/redis"
	"github.com/capsnap/capsnap/examples/billing"
)

// The shared snapshot store (issue 15): capsnap replicas sharing their
// snapshots, invalidations and sequence-rule records in Redis
// (cache/redis, snapshots.store: redis).

// storePattern selects the shared store's Go benchmarks
// (decide/store_bench_test.go); the hot-path run skips them.
const storePattern = "^(BenchmarkCheckStore|BenchmarkSnapshotsRedis)$"

// storeBenchmarks runs the shared store's Go benchmarks: the allowed Check
// on each store, and Redis's memory per snapshot. Each must have run: a
// Redis case skipped for want of a redis-server fails the step.
func (h *harness) storeBenchmarks(ctx context.Context) error {
	res, err := h.goBench("store", storePattern, "", "./decide").Do(ctx)
	if err != nil {
		return err
	}
	want := []string{fmt.Sprintf(report.BenchSnapshotsRedis, report.RedisSnapshots)}
	for _, c := range report.StoreCases {
		want = append(want, fmt.Sprintf(report.BenchCheckStore, c))
	}
	for _, name := range want {
		if _, ok := gobench.Find(res, name); !ok {
			return fmt.Errorf("%s did not run (skipped? see %s)", name, filepath.Join(h.logs, "go-bench-store.log"))
		}
	}
	h.results.Store.Bench = res
	for _, r := range res {
		h.logf("   %-55s %s", r.Name, report.Dur(time.Duration(r.Metrics["ns/op"])))
	}
	return nil
}

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

// storeSeq reads the store's invalidation sequence from Redis: cache/redis
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
		return 0, fmt.Errorf("redis %s = %q: not <incarnation>.<n>.<nonce>.<mac> (has cache/redis's record changed?)", key, raw)
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
