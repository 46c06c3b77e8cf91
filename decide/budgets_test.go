package decide

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/capsnap/capsnap/deny"
)

// The counters an operator reads are what the calls took, in the store,
// under the policy in force: a budget in its units, a rate limit in calls,
// each with when what it holds stops counting.
func TestCountersShowWhatCallsTook(t *testing.T) {
	f := limitsFixture(t)
	now := f.clock.now()
	for range 2 {
		if o := f.call(t, refundOf(200)); o.reason != "" {
			t.Fatalf("refund: %s (%s)", o.reason, o.data.Detail)
		}
	}
	// In a later slot, under a fresh catalog and snapshot.
	f.clock.advance(30 * time.Minute)
	f.billing.push(t, "testdata/pack/catalog.json", nil)
	f.list(t, support, "billing", nil)
	if o := f.call(t, refundOf(50.5)); o.reason != "" {
		t.Fatalf("refund: %s (%s)", o.reason, o.data.Detail)
	}
	got, err := f.Counters(support, "billing", "refund", "")
	if err != nil {
		t.Fatal(err)
	}
	// A 24h window counts in slots of 24m: each amount until its slot
	// ends, and a window after.
	slot := (24 * time.Hour / 60).Milliseconds()
	stop := func(at time.Time) time.Time {
		ms := at.UnixMilli()
		return time.UnixMilli(ms - ms%slot + slot).Add(24 * time.Hour).UTC()
	}
	want := Counter{Kind: "budget", Name: "daily_refunds", Rule: "tools[0].budgets[0]", Used: 450.5, Limit: 500, Window: "24h",
		FreesAt: stop(now), ResetsAt: stop(now.Add(30 * time.Minute))}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("refund's counters: %+v, want %+v", got, want)
	}

	for range 3 {
		f.call(t, argsCall("lookup_order", lookup))
	}
	got, err = f.Counters(support, "billing", "lookup_order", "lookups")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Kind != "rate_limit" || got[0].Used != 3 || got[0].Limit != 5 || got[0].Window != "1m" ||
		got[0].Rule != "principals[0].grants[1].rate_limits[0]" {
		t.Fatalf("lookup_order's counters: %+v", got)
	}
	// Another principal's counter is its own.
	got, err = f.Counters("spiffe://acme/agent/auditor", "billing", "lookup_order", "")
	if err != nil || len(got) != 0 {
		t.Fatalf("the auditor's, under no limit: %+v, %v", got, err)
	}
}

// A reset empties the one counter it names: the principal has the window
// again; it says what the counter held, and is audited with who and why,
// and counted.
func TestResetCounter(t *testing.T) {
	f := limitsFixture(t)
	for range 2 {
		f.call(t, refundOf(250))
	}
	f.call(t, argsCall("lookup_order", lookup))
	if o := f.call(t, refundOf(1)); o.reason != deny.BudgetExhausted {
		t.Fatalf("a refund over the budget: %q", o.reason)
	}
	held, err := f.ResetCounter(support, "billing", "refund", "daily_refunds", alice)
	if err != nil {
		t.Fatal(err)
	}
	if held.Used != 500 || held.Limit != 500 || held.FreesAt.IsZero() {
		t.Fatalf("the reset counter held %+v", held)
	}
	if got, err := f.Counters(support, "billing", "refund", ""); err != nil || len(got) != 1 || got[0].Used != 0 || !got[0].FreesAt.IsZero() || !got[0].ResetsAt.IsZero() {
		t.Fatalf("after the reset: %+v, %v", got, err)
	}
	if got, err := f.Counters(support, "billing", "lookup_order", ""); err != nil || len(got) != 1 || got[0].Used != 1 {
		t.Fatalf("the rate limit, not reset: %+v, %v", got, err)
	}
	for range 2 {
		if o := f.call(t, refundOf(250)); o.reason != "" {
			t.Fatalf("a refund after the reset: %s (%s)", o.reason, o.data.Detail)
		}
	}
	var line map[string]any
	for _, l := range auditLines(t, f) {
		if l["event"] == "counter_reset" {
			line = l
		}
	}
	if line == nil || line["kind"] != "budget" || line["name"] != "daily_refunds" || line["rule"] != "tools[0].budgets[0]" ||
		line["principal"] != support || line["server_id"] != "billing" || line["tool"] != "refund" ||
		line["used"] != 500.0 || line["by"] != alice.By || line["reason"] != alice.Reason {
		t.Errorf("the reset's audit line: %v", line)
	}
	if got := testutil.ToFloat64(f.metrics.resets.WithLabelValues("budget", "daily_refunds")); got != 1 {
		t.Errorf("resets counted %v, want 1", got)
	}
}

// What a reset or a read cannot name is refused, and nothing is reset.
func TestCounterRefusals(t *testing.T) {
	dir := t.TempDir()
	base, err := os.ReadFile("testdata/limits/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The grant has a budget of the tool's budget's name: two counters.
	both := strings.Replace(string(base), "      - {server: billing, tools: [refund]}",
		"      - {server: billing, tools: [refund], budgets: [{name: daily_refunds, amount: args.amount, limit: 1000, window: 24h}]}", 1)
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(both), 0o600); err != nil {
		t.Fatal(err)
	}
	f := limitsFixture(t, func(o *Options) { o.Rules = mustRules(t, path) })
	f.call(t, refundOf(100))
	for _, tt := range []struct {
		name                    string
		principal, server, tool string
		rule                    string
		by                      Signoff
		want                    error
		why                     string
	}{
		{"a principal not granted the tool", "spiffe://acme/agent/auditor", "billing", "refund", "daily_refunds", alice, ErrNoCounter, "does not grant billing/refund"},
		{"an unknown tool", support, "billing", "delete_everything", "daily_refunds", alice, ErrNoCounter, "does not grant"},
		{"a rule that counts nothing here", support, "billing", "refund", "lookups", alice, ErrNoCounter, `no budget or rate limit "lookups"`},
		{"no rule", support, "billing", "refund", "", alice, ErrNoCounter, "names its budget or rate limit"},
		{"a name two share", support, "billing", "refund", "daily_refunds", alice, ErrAmbiguousCounter, "tools[0].budgets[0] and principals[0].grants[0].budgets[0]"},
		{"no one", support, "billing", "refund", "tools[0].budgets[0]", Signoff{Reason: "x"}, nil, "by is required"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.ResetCounter(tt.principal, tt.server, tt.tool, tt.rule, tt.by)
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) || !strings.Contains(err.Error(), tt.why) {
				t.Fatalf("ResetCounter: %v, want %v: %q", err, tt.want, tt.why)
			}
		})
	}
	// Either of the two, by where the policy declares it; a read shows both.
	got, err := f.Counters(support, "billing", "refund", "daily_refunds")
	if err != nil || len(got) != 2 || got[0].Used != 100 || got[1].Used != 100 || got[1].Limit != 1000 {
		t.Fatalf("both daily_refunds: %+v, %v", got, err)
	}
	if held, err := f.ResetCounter(support, "billing", "refund", "principals[0].grants[0].budgets[0]", alice); err != nil || held.Limit != 1000 || held.Used != 100 {
		t.Fatalf("the grant's: %+v, %v", held, err)
	}
	if got, err := f.Counters(support, "billing", "refund", ""); err != nil || len(got) != 2 || got[0].Used != 100 || got[1].Used != 0 {
		t.Fatalf("after resetting the grant's: %+v, %v", got, err)
	}
}
