package policytest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/policy"
)

// runner is testdata/policy.yaml's, with tools as the servers' catalogs.
func runner(t testing.TB, tools map[string][]json.RawMessage) *Runner {
	t.Helper()
	p, err := policy.Load("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return &Runner{Policy: p, Tools: tools, Now: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)}
}

// Each case of kinds.yaml, a rule kind at a time and all of them at once,
// is decided by the decision core as it expects, and as explain said;
// together they see every decision a rule can make.
func TestKinds(t *testing.T) {
	f, err := Load("testdata/kinds.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := runner(t, nil)
	seen := map[Outcome]bool{}
	for _, c := range f.Cases {
		t.Run(c.Name, func(t *testing.T) {
			res := r.Run(c)
			if !res.Passed() {
				t.Fatalf("want %s, got %s (%v); disagreement %q, error %v\n%s", c.Want, res.Got, res.Denial, res.Disagreement, res.Err, strings.Join(res.Explain, "\n"))
			}
			seen[res.Got] = true
		})
	}
	for _, want := range []Outcome{{Decision: Allow}, {Decision: Held}} {
		if !seen[want] {
			t.Errorf("no case was decided %s", want)
		}
	}
	for _, r := range reasons {
		if !seen[Outcome{Decision: Deny, Reason: r}] && r != deny.InvalidArguments && r != deny.UnknownTool {
			t.Errorf("no case was denied %s", r)
		}
	}
}

// Explain and the decision core agree on every call testdata/policy.yaml
// can be asked: every tool it classifies and one it does not, by every
// principal rule and none, on arguments that pass and fail each rule, in
// every state a case can give, inside and outside the schedules.
func TestExplainAgrees(t *testing.T) {
	r := runner(t, nil)
	tools := [][2]string{{"payments", "charge"}, {"billing", "delete_ledger"}}
	for _, tool := range []string{"lookup_order", "refund", "transfer", "search", "payout", "close_books", "wire"} {
		tools = append(tools, [2]string{"billing", tool})
	}
	principals := []string{"spiffe://acme/agent/support", "spiffe://acme/agent/readonly", "spiffe://acme/agent/other"}
	args := []string{`{}`, `{"amount": 40}`, `{"amount": 150, "iban": "EE38"}`, `{"amount": 700, "iban": "EE38"}`, `{"amount": 2000, "iban": "EE38"}`}
	times := []time.Time{time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC), time.Date(2026, 12, 12, 23, 0, 0, 0, time.UTC)}
	runs := map[string]int{}
	for _, tool := range tools {
		for _, principal := range principals {
			for _, a := range args {
				for _, at := range times {
					base := Case{Principal: principal, Server: tool[0], Tool: tool[1], Arguments: json.RawMessage(a), At: at}
					for _, c := range states(r.Policy, base) {
						res := r.Run(c)
						if res.Err != nil {
							t.Fatalf("%s: %v", c.Name, res.Err)
						}
						if res.Disagreement != "" {
							t.Errorf("%s: %s\n%s", c.Name, res.Disagreement, strings.Join(res.Explain, "\n"))
						}
						runs[res.Got.String()]++
					}
				}
			}
		}
	}
	// The sweep reaches every decision, or it proves little.
	for _, want := range []string{"allow", "held", "deny approval_denied", "deny budget_exhausted", "deny constraint_violation",
		"deny outside_schedule", "deny rate_limited", "deny sequence_violation", "deny tool_not_granted", "deny unclassified_tool"} {
		if runs[want] == 0 {
			t.Errorf("no call was decided %s: %v", want, runs)
		}
	}
}

// states are base in each state a case can give its call: none, its
// sequence met, its budgets full, its rate limits full, its approval
// approved, denied or pending.
func states(p *policy.Policy, base Case) []Case {
	out := []Case{base}
	d, err := p.Decide(base.Principal, base.Server, base.Tool)
	if err != nil {
		return named(out)
	}
	called := base
	called.Called = []string{"lookup_order"}
	out = append(out, called)
	budgets, rateLimits := called, called
	budgets.Used, rateLimits.Used = map[string]float64{}, map[string]float64{}
	for _, term := range d.Terms {
		switch term := term.(type) {
		case *policy.Budget:
			_, field := term.Names()
			budgets.Used[field] = 1e6
		case *policy.RateLimit:
			_, field := term.Names()
			rateLimits.Used[field] = 1e6
		case *policy.ApprovalRule:
			for _, a := range []string{Approved, Denied, Pending} {
				c := called
				c.Approval = a
				out = append(out, c)
			}
		}
	}
	for _, c := range []Case{budgets, rateLimits} {
		if len(c.Used) > 0 {
			out = append(out, c)
		}
	}
	return named(out)
}

func named(cs []Case) []Case {
	for i := range cs {
		c := &cs[i]
		c.Name = fmt.Sprintf("%s %s/%s %s at %s called %v used %v approval %q", c.Principal, c.Server, c.Tool, c.Arguments, c.At.Format(time.RFC3339), c.Called, c.Used, c.Approval)
	}
	return cs
}

// The judge of explain against the core: a call explain denies must be
// denied for a reason explain gives, one it leaves to the store must be
// allowed or denied for one of those, one it allows must be allowed;
// what the catalog decides before the rules is not explain's.
func TestDisagreement(t *testing.T) {
	constraint := policy.Denial{Rule: "usd_cap_250", Reason: deny.ConstraintViolation}
	denied := func(r deny.Reason) *deny.Error { return &deny.Error{Reason: r} }
	tests := []struct {
		name    string
		verdict policy.Verdict
		denial  *deny.Error
		want    string // "" for agreement
	}{
		{"both allow", policy.Verdict{}, nil, ""},
		{"explain allows, the core holds", policy.Verdict{}, denied(deny.ApprovalRequired),
			"explain allows it; the decision core denied it approval_required"},
		{"explain allows, the core denies", policy.Verdict{}, denied(deny.ConstraintViolation),
			"explain allows it; the decision core denied it constraint_violation"},
		{"explain denies, the core allows", policy.Verdict{Denials: []policy.Denial{constraint}}, nil,
			"explain denies it (constraint_violation: usd_cap_250); the decision core allowed it"},
		{"both deny", policy.Verdict{Denials: []policy.Denial{constraint}}, denied(deny.ConstraintViolation), ""},
		{"both deny, for other reasons", policy.Verdict{Denials: []policy.Denial{constraint}}, denied(deny.ToolNotGranted),
			"explain denies it (constraint_violation: usd_cap_250); the decision core denied it tool_not_granted"},
		{"explain denies, the store first", policy.Verdict{Denials: []policy.Denial{constraint}, Otherwise: []deny.Reason{deny.RateLimited}},
			denied(deny.RateLimited), ""},
		{"left to the store, allowed", policy.Verdict{Otherwise: []deny.Reason{deny.ApprovalRequired}}, nil, ""},
		{"left to the store, held", policy.Verdict{Otherwise: []deny.Reason{deny.ApprovalRequired}}, denied(deny.ApprovalRequired), ""},
		{"left to the store, denied otherwise", policy.Verdict{Otherwise: []deny.Reason{deny.BudgetExhausted}}, denied(deny.ApprovalRequired),
			"explain allows it unless budget_exhausted; the decision core denied it approval_required"},
		{"left to the store, denied otherwise, among many", policy.Verdict{Otherwise: []deny.Reason{deny.RateLimited, deny.BudgetExhausted, deny.SequenceViolation}},
			denied(deny.ApprovalRequired), "explain allows it unless rate_limited, budget_exhausted or sequence_violation; the decision core denied it approval_required"},
		{"the catalog's", policy.Verdict{}, denied(deny.InvalidArguments), ""},
		{"the catalog's, where explain denies", policy.Verdict{Denials: []policy.Denial{constraint}}, denied(deny.UnknownTool), ""},
		{"a snapshot's", policy.Verdict{}, denied(deny.NoSnapshot), "explain allows it; the decision core denied it no_snapshot"},
	}
	for _, tt := range tests {
		if got := disagreement(tt.verdict, tt.denial); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

// With a server's tools/list, a call is held to its tools' input schemas,
// before any rule: a call the schema refuses, or to a tool the server
// does not list, is the catalog's to deny, not explain's to foresee.
func TestCatalog(t *testing.T) {
	defs, err := (&catalog.FileSource{Path: "testdata/billing-tools.json"}).Load()
	if err != nil {
		t.Fatal(err)
	}
	r := runner(t, map[string][]json.RawMessage{"billing": defs})
	for _, tt := range []struct {
		tool, args string
		want       Outcome
	}{
		{"transfer", `{"amount": 40, "to": "EE38"}`, Outcome{Decision: Allow}},
		{"transfer", `{"amount": 40}`, Outcome{Decision: Deny, Reason: deny.InvalidArguments}},
		{"transfer", `{"amount": "forty", "to": "EE38"}`, Outcome{Decision: Deny, Reason: deny.InvalidArguments}},
		{"transfer", `{"amount": 600, "to": "EE38"}`, Outcome{Decision: Deny, Reason: deny.ConstraintViolation}},
		{"search", `{}`, Outcome{Decision: Deny, Reason: deny.UnknownTool}},
	} {
		res := r.Run(Case{Principal: "spiffe://acme/agent/support", Server: "billing", Tool: tt.tool, Arguments: json.RawMessage(tt.args)})
		if res.Err != nil || res.Disagreement != "" || res.Got != tt.want {
			t.Errorf("%s %s: %s (%v), disagreement %q, error %v; want %s", tt.tool, tt.args, res.Got, res.Denial, res.Disagreement, res.Err, tt.want)
		}
	}
}

// A case whose state names a rule its call is not under cannot be decided
// as written: it fails, saying which rules the call is under.
func TestStateOutsideTheCall(t *testing.T) {
	r := runner(t, nil)
	support := "spiffe://acme/agent/support"
	for _, tt := range []struct {
		c    Case
		want string
	}{
		{Case{Principal: support, Server: "billing", Tool: "transfer", Used: map[string]float64{"daily_transfer": 1}},
			"used: daily_transfer is none of the call's budgets and rate limits: billing_calls (principals[0].grants[0].rate_limits[0]), daily_transfers (tools[2].budgets[0]), daily_transfers (principals[0].grants[0].budgets[0])"},
		{Case{Principal: support, Server: "billing", Tool: "transfer", Used: map[string]float64{"daily_transfers": 1}},
			"used: daily_transfers names more than one of the call's budgets and rate limits"},
		{Case{Principal: support, Server: "billing", Tool: "search", Used: map[string]float64{"search_burst": 1.5}},
			"used: search_burst: 1.5 is more than any counter holds, or not a whole number of calls"},
		{Case{Principal: support, Server: "payments", Tool: "charge", Used: map[string]float64{"x": 1}},
			"used: x: the call is under no budget or rate limit"},
		{Case{Principal: support, Server: "billing", Tool: "refund", Approval: Approved},
			"approval: billing/refund has no approval rule"},
		{Case{Principal: "spiffe://acme/agent/readonly", Server: "billing", Tool: "payout", Approval: Approved},
			"the case sets what the call's rules hold, and the policy does not grant the call"},
	} {
		tt.c.Arguments = json.RawMessage(`{}`)
		if res := r.Run(tt.c); res.Err == nil || !strings.Contains(res.Err.Error(), tt.want) || res.Passed() {
			t.Errorf("%+v: %v, want %q", tt.c, res.Err, tt.want)
		}
	}
}
