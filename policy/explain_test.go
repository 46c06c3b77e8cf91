package policy

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/deny"
)

func TestExplain(t *testing.T) {
	p := mustLoad(t, "testdata/seed.yaml")
	d, err := p.Decide("spiffe://acme/agent/support-refund", "billing", "refund")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                    string
		principal, server, tool string
		args                    map[string]any
		want                    []string // each must be a line, in this order
	}{
		{"allowed", support, "billing", "refund", map[string]any{"amount": 40.0, "reason_code": "damaged"}, []string{
			`principal "spiffe://acme/agent/support-refund" is decided by rule id:spiffe://acme/agent/support-refund (principals[0])`,
			"billing/refund is money_move (tools[1]) and exercises capabilities payments.refund",
			`granted by principals[0].grants[0]: "refund" on billing, max_effect money_move, confers capabilities payments.refund`,
			`constraint "usd_cap_250" (tools[1].constraints[0]): args.amount <= 250: holds`,
			`constraint "reason_allowlist" (tools[1].constraints[1]): args.reason_code in ['duplicate_charge', 'not_received', 'damaged']: holds`,
			"after: only once lookup_order has been called, and allowed, under the same snapshot",
			"decision digest " + d.Digest,
			"allowed, if the sequence rule is met",
		}},
		{"over the cap, reason missing", support, "billing", "refund", map[string]any{"amount": 250.01}, []string{
			`constraint "usd_cap_250" (tools[1].constraints[0]): args.amount <= 250: DOES NOT HOLD: refunds are capped at USD 250 per call`,
			`constraint "reason_allowlist" (tools[1].constraints[1]): args.reason_code in ['duplicate_charge', 'not_received', 'damaged']: DOES NOT HOLD, its evaluation failed (no such key: reason_code): reason_code must be duplicate_charge, not_received or damaged`,
			"denied (constraint_violation): usd_cap_250, reason_allowlist",
		}},
		{"no arguments", support, "billing", "refund", nil, []string{
			`constraint "usd_cap_250" (tools[1].constraints[0]): args.amount <= 250: not evaluated, no arguments given`,
			"granted; its constraints decide each call",
		}},
		{"read tool", support, "billing", "lookup_order", nil, []string{
			"billing/lookup_order is read (tools[0]) and exercises no capabilities",
			"no constraints",
			"no sequence rule",
			"allowed",
		}},
		{"not granted", "spiffe://acme/agent/support-readonly", "billing", "refund", nil, []string{
			`principal "spiffe://acme/agent/support-readonly" is decided by rule id:spiffe://acme/agent/support-readonly (principals[1])`,
			"denied (tool_not_granted): it is in no grant",
		}},
		{"no rule", "spiffe://acme/agent/other", "billing", "lookup_order", nil, []string{
			`principal "spiffe://acme/agent/other" matches no principal rule`,
			"denied (tool_not_granted): no principal rule matches",
		}},
		{"unclassified", support, "billing", "delete_everything", nil, []string{
			"billing/delete_everything is not classified, so it has no effect class: denied (unclassified_tool)",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inOrder(t, p.Explain(tt.principal, tt.server, tt.tool, tt.args, time.Time{}), tt.want)
		})
	}
	ceiling := mustLoad(t, "testdata/decide.yaml").Explain("spiffe://acme/agent/triage", "billing", "refund", nil, time.Time{})
	if last := ceiling[len(ceiling)-1]; last != "denied (tool_not_granted): it is money_move, above its grant's max_effect write (principals[1].grants[0])" {
		t.Errorf("ceiling denial explained as %q", last)
	}
}

// Budgets and rate limits are shown with what a call would take; a call a
// budget denies whatever its counter holds is denied.
func TestExplainLimits(t *testing.T) {
	p := mustLoad(t, "testdata/limits.yaml")
	d := decide(t, p, support, "billing", "refund")
	tests := []struct {
		name string
		args map[string]any
		want []string
	}{
		{"allowed", map[string]any{"amount": 200.0}, []string{
			`rate limit "refund_burst" (tools[0].rate_limits[0]): at most 10 calls per 1m, per principal, on the tool`,
			`rate limit "billing_calls" (principals[0].grants[0].rate_limits[0]): at most 100 calls per 1h, per principal, on the grant`,
			`budget "daily_refunds" (tools[0].budgets[0]): the sum of args.amount, at most 500 per 24h, per principal, on the tool: this call would take 200`,
			`budget "money_out" (principals[0].grants[0].budgets[0]): the sum of has(args.amount) ? args.amount : 0, at most 2000 per 24h, per principal, on the grant: this call would take 200`,
			"after: only once lookup_order has been called, and allowed, under the same snapshot",
			"decision digest " + d.Digest,
			"allowed, if its rate limits have room, its budgets have room and the sequence rule is met",
		}},
		{"more than the budget", map[string]any{"amount": 600.0}, []string{
			`budget "daily_refunds" (tools[0].budgets[0]): the sum of args.amount, at most 500 per 24h, per principal, on the tool: DENIES THE CALL: budget "daily_refunds" allows 500 per 24h; this call's 600 is more than all of it, so no window can hold it`,
			"denied (constraint_violation): usd_cap_250, daily_refunds",
		}},
		{"no arguments", nil, []string{
			`budget "daily_refunds" (tools[0].budgets[0]): the sum of args.amount, at most 500 per 24h, per principal, on the tool: not evaluated, no arguments given`,
			"granted; its constraints and budgets decide each call",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inOrder(t, p.Explain(support, "billing", "refund", tt.args, time.Time{}), tt.want)
		})
	}
	inOrder(t, p.Explain("spiffe://acme/agent/other", "billing", "lookup_order", nil, time.Time{}), []string{
		`rate limit "per_tool" (principals[1].grants[0].rate_limits[0]): at most 5 calls per 10s, per principal and tool, on the grant`,
		"allowed, if its rate limits have room",
	})
	inOrder(t, mustLoad(t, "testdata/seed.yaml").Explain(support, "billing", "lookup_order", nil, time.Time{}), []string{"no rate limits", "no budgets", "no approval rule", "allowed"})
}

// inOrder fails t unless each of want is a line of got, in this order.
func inOrder(t *testing.T, got, want []string) {
	t.Helper()
	at := 0
	for _, w := range want {
		i := slices.Index(got[at:], w)
		if i < 0 {
			t.Fatalf("no line %q (in order) in:\n%s", w, strings.Join(got, "\n"))
		}
		at += i + 1
	}
}

// An approval rule says whether the call waits for a person, and the
// verdict says so: it is no denial, and no plain "allowed" either.
func TestExplainApproval(t *testing.T) {
	p := mustLoad(t, "testdata/approval.yaml")
	const rule = `approval (tools[0].approval when args.amount > 100, approvers alice@acme.example, group:oncall): `
	tests := []struct {
		name string
		args map[string]any
		want []string
	}{
		{"held", map[string]any{"amount": 150.0}, []string{
			rule + "this call waits for a person's approval of its exact arguments",
			"allowed, if a person approves it",
		}},
		{"not held", map[string]any{"amount": 50.0}, []string{rule + "this call needs no approval", "allowed"}},
		{"when fails", map[string]any{}, []string{
			rule + "its when could not be evaluated (no such key: amount), which DENIES THE CALL",
			"denied (constraint_violation): tools[0].approval",
		}},
		{"no arguments", nil, []string{
			rule + "not evaluated, no arguments given",
			"allowed, if a person approves it when args.amount > 100",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inOrder(t, p.Explain(support, "billing", "refund", tt.args, time.Time{}), tt.want)
		})
	}
}

// Verdict concludes as Explain's last line does: the rules that deny the
// call whatever the store holds, and the reasons what Explain could not
// evaluate may still deny it for.
func TestVerdict(t *testing.T) {
	refund := map[string]any{"amount": 40.0, "reason_code": "damaged"}
	monday := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name, file, principal, tool string
		args                        map[string]any
		at                          time.Time
		want                        Verdict
	}{
		{"allowed", "seed.yaml", support, "lookup_order", nil, time.Time{}, Verdict{}},
		{"after", "seed.yaml", support, "refund", refund, time.Time{},
			Verdict{Otherwise: []deny.Reason{deny.SequenceViolation}}},
		{"constraints", "seed.yaml", support, "refund", map[string]any{"amount": 251.0}, time.Time{},
			Verdict{Denials: []Denial{{"usd_cap_250", deny.ConstraintViolation}, {"reason_allowlist", deny.ConstraintViolation}},
				Otherwise: []deny.Reason{deny.SequenceViolation}}},
		{"no arguments", "seed.yaml", support, "refund", nil, time.Time{},
			Verdict{Otherwise: []deny.Reason{deny.ConstraintViolation, deny.SequenceViolation}}},
		{"not granted", "seed.yaml", "spiffe://acme/agent/support-readonly", "refund", nil, time.Time{},
			Verdict{Denials: []Denial{{"principals[1]", deny.ToolNotGranted}}}},
		{"no principal rule", "seed.yaml", "spiffe://acme/agent/other", "refund", nil, time.Time{},
			Verdict{Denials: []Denial{{"principals", deny.ToolNotGranted}}}},
		{"unclassified", "seed.yaml", support, "delete_everything", nil, time.Time{},
			Verdict{Denials: []Denial{{"billing/delete_everything", deny.UnclassifiedTool}}}},
		{"limits", "limits.yaml", support, "refund", map[string]any{"amount": 200.0}, time.Time{},
			Verdict{Otherwise: []deny.Reason{deny.RateLimited, deny.BudgetExhausted, deny.SequenceViolation}}},
		{"over a budget", "limits.yaml", support, "refund", map[string]any{"amount": 600.0}, time.Time{},
			Verdict{Denials: []Denial{{"usd_cap_250", deny.ConstraintViolation}, {"daily_refunds", deny.ConstraintViolation}},
				Otherwise: []deny.Reason{deny.RateLimited, deny.BudgetExhausted, deny.SequenceViolation}}},
		{"held", "approval.yaml", support, "refund", map[string]any{"amount": 150.0}, time.Time{},
			Verdict{Otherwise: []deny.Reason{deny.ApprovalRequired, deny.ApprovalDenied, deny.RateLimited}}},
		{"not held", "approval.yaml", support, "refund", map[string]any{"amount": 50.0}, time.Time{}, Verdict{}},
		{"inside", "schedule.yaml", support, "refund", refund, monday, Verdict{Otherwise: []deny.Reason{deny.RateLimited}}},
		{"outside", "schedule.yaml", support, "refund", refund, monday.Add(12 * time.Hour),
			Verdict{Denials: []Denial{{"tools[0].schedule", deny.OutsideSchedule}, {"principals[0].grants[0].schedule", deny.OutsideSchedule}},
				Otherwise: []deny.Reason{deny.RateLimited}}},
		{"no time", "schedule.yaml", support, "refund", refund, time.Time{},
			Verdict{Otherwise: []deny.Reason{deny.OutsideSchedule, deny.RateLimited}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustLoad(t, "testdata/"+tt.file)
			got := p.Verdict(tt.principal, "billing", tt.tool, tt.args, tt.at)
			if !slices.Equal(got.Denials, tt.want.Denials) || !slices.Equal(got.Otherwise, tt.want.Otherwise) {
				t.Errorf("Verdict = %+v, want %+v", got, tt.want)
			}
			lines := p.Explain(tt.principal, "billing", tt.tool, tt.args, tt.at)
			if denied := strings.HasPrefix(lines[len(lines)-1], "denied") || strings.Contains(lines[len(lines)-1], ": denied ("); denied != (len(got.Denials) > 0) {
				t.Errorf("Explain concludes %q, Verdict %+v", lines[len(lines)-1], got)
			}
		})
	}
}
