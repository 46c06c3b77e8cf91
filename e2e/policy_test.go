//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/testbed"
)

// startSeedStack runs the stack under the seed's policy, the one the demo
// ships: a USD 250 cap, a reason allowlist, refund only after lookup_order.
func startSeedStack(t *testing.T) *testbed.Stack {
	t.Helper()
	seed, err := os.ReadFile("../examples/demo/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return startStackWith(t, func(o *testbed.StackOptions) { o.Policy = seed })
}

func refundOf(amount any, reason string) map[string]any {
	return map[string]any{"order_id": "A-100", "amount": amount, "reason_code": reason}
}

var lookupA100 = map[string]any{"order_id": "A-100"}

func TestSeedPolicy(t *testing.T) {
	s := startSeedStack(t)
	tests := []struct {
		name   string
		lookup bool
		args   map[string]any
		want   string
	}{
		{"the worked example", true, refundOf(40, "duplicate_charge"), ""},
		{"at the cap", true, refundOf(250, "damaged"), ""},
		{"a cent over the cap", true, refundOf(250.01, "damaged"), "constraint_violation"},
		{"reason outside the allowlist", true, refundOf(40, "goodwill"), "constraint_violation"},
		{"refund before lookup", false, refundOf(40, "duplicate_charge"), "sequence_violation"},
		{"unpinned consequential field", true, map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "damaged", "skip_fraud_check": true}, "invalid_arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := connect(t, s, "billing", supportAgent, "2025-11-25")
			c.list(t)
			if tt.lookup {
				if r := c.call(t, "lookup_order", lookupA100); r != "" {
					t.Fatalf("lookup_order: %q", r)
				}
			}
			before := starts(t, s, "billing", "refund")
			if r := c.call(t, "refund", tt.args); r != tt.want {
				t.Fatalf("refund: %q, want %q", r, tt.want)
			}
			ran := starts(t, s, "billing", "refund") - before
			if (tt.want == "") != (ran == 1) {
				t.Fatalf("refund handler ran %d times for decision %q", ran, tt.want)
			}
		})
	}
}

// A reload that raises the cap is refused; the operator's explicit
// `capsnap policy reload --allow-loosening` (with --by and --reason) puts
// it in force for new snapshots only, and old ones deny with policy_drift.
func TestReloadRaisingTheCap(t *testing.T) {
	s := startSeedStack(t)
	seed, err := os.ReadFile("../examples/demo/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := connect(t, s, "billing", supportAgent, "")
	c.list(t)
	if r := c.call(t, "lookup_order", lookupA100); r != "" {
		t.Fatalf("lookup_order: %q", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	raised := strings.Replace(string(seed), `expr: "args.amount <= 250"`, `expr: "args.amount <= 500"`, 1)
	if raised == string(seed) {
		t.Fatal("the cap edit did not apply")
	}
	if err := s.ReloadPolicy(ctx, []byte(raised)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s.Capsnap.Output(), "policy reload refused") {
		t.Fatal("capsnap did not refuse the loosening reload")
	}
	if r := c.call(t, "refund", refundOf(300, "damaged")); r != "constraint_violation" {
		t.Fatalf("USD 300 after a refused reload: %q, want the old cap to hold", r)
	}

	out, err := exec.CommandContext(ctx, bins["capsnap"], "policy", "reload", "--admin", s.AdminAddr(), "--allow-loosening",
		"--by", "alice@acme.example", "--reason", "the cap goes to USD 500").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "policy reload: ok") {
		t.Fatalf("capsnap policy reload --allow-loosening: %v\n%s", err, out)
	}
	if r := c.call(t, "refund", refundOf(300, "damaged")); r != "policy_drift" {
		t.Fatalf("old snapshot after the loosening: %q, want policy_drift", r)
	}
	c.list(t)
	if r := c.call(t, "lookup_order", lookupA100); r != "" {
		t.Fatalf("lookup_order: %q", r)
	}
	if r := c.call(t, "refund", refundOf(300, "damaged")); r != "" {
		t.Fatalf("new snapshot under the new cap: %q", r)
	}
}

// capsnap lock approves what is live; a tool that then changes waits for
// review: it joins no snapshot, and its call is tool_unapproved.
func TestLockfileHoldsChangedTool(t *testing.T) {
	s := startSeedStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := s.Dir() + "/capsnap.yaml"
	lock := s.Dir() + "/capsnap.lock"
	if out, err := exec.CommandContext(ctx, bins["capsnap"], "lock", "--config", cfg, "--out", lock).CombinedOutput(); err != nil {
		t.Fatalf("capsnap lock: %v\n%s", err, out)
	}
	seed, err := os.ReadFile("../examples/demo/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Adding a lockfile tightens: the reload needs no permission.
	if err := s.ReloadPolicy(ctx, append([]byte("lockfile: capsnap.lock\n"), seed...)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(s.Capsnap.Output(), "policy reload refused") {
		t.Fatalf("adding a lockfile was refused:\n%s", s.Capsnap.Output())
	}
	c := connect(t, s, "billing", supportAgent, "")
	c.list(t)
	if r := c.call(t, "lookup_order", lookupA100); r != "" {
		t.Fatalf("approved lookup_order: %q", r)
	}

	redeploy(t, s, "billing", "description_edit")
	out, err := exec.CommandContext(ctx, bins["capsnap"], "lock", "--check", "--config", cfg, "--out", lock).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "changed billing/refund") {
		t.Fatalf("lock --check after the redeploy: %v\n%s", err, out)
	}
	c.list(t)
	if r := c.call(t, "lookup_order", lookupA100); r != "" {
		t.Fatalf("unchanged lookup_order: %q", r)
	}
	if r := c.call(t, "refund", refundOf(40, "duplicate_charge")); r != "tool_unapproved" {
		t.Fatalf("refund changed outside the lockfile: %q, want tool_unapproved", r)
	}
}
