package policy

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestLint(t *testing.T) {
	p := mustParse(t, `
tools:
  - {server: billing, tool: lookup_order, effect: read}
  - {server: billing, tool: refund, effect: money_move, after: [lookup_order], capabilities: [payments.refund]}
  - {server: billing, tool: purge, effect: admin}
  - {server: crm, tool: update, effect: write}
  - {server: crm, tool: delete, effect: admin}
principals:
  - id: a
    grants:
      - {server: billing, tools: [refund], capabilities: [payments.refund]}
  - id: b
    grants: []
  - id: c
    grants:
      - {server: crm, tools: [update, delete], max_effect: read}
      - server: billing
        tools: ["*"]
        capabilities: [payments.refund, payments.lage]
        constraints:
          - {name: cap, expr: "args.amount <= 250"}
          - {name: guarded, expr: "!has(args.force) || args.force == false"}
        budgets:
          - {name: spend, amount: args.amount, limit: 1000, window: 24h}
          - {name: guarded_spend, amount: "has(args.amount) ? args.amount : 0", limit: 1000, window: 24h}
  - id: d
    grants:
      - {server: files, tools: ["*"]}
      - {server: billing, tools: [lookup_order, refund], max_effect: read}
`)
	want := []string{
		"principals[0]: grants billing/refund but not billing/lookup_order, which must be called first, so refund can never be called",
		"principals[1].grants: id:b grants nothing (fine if it is meant to deny every principal it matches)",
		"principals[2].grants[0].max_effect: read excludes every tool the grant names",
		"principals[2].grants[1].capabilities: no tool of billing exercises payments.lage",
		"principals[2].grants[1].constraints[0].expr: reads args.amount but applies to each of lookup_order, purge, refund; a call without amount is denied (guard it with has(args.amount), or move it to the tool)",
		"principals[2].grants[1].budgets[0].amount: reads args.amount but applies to each of lookup_order, purge, refund; a call without amount is denied (write has(args.amount) ? args.amount : 0, or move the budget to the tool)",
		`principals[3].grants[0].tools: "*" decides no tool: no tool of files is classified, or another grant names each one`,
		"principals[3].grants[1].tools: names tools it does not grant (billing/refund: it is money_move, above its grant's max_effect read)",
		"tools[3]: crm/update is granted by no principal rule",
		"tools[4]: crm/delete is granted by no principal rule",
	}
	slices.Sort(want)
	if got := Lint(p); !slices.Equal(got, want) {
		t.Errorf("Lint =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := Lint(mustLoad(t, "testdata/seed.yaml")); len(got) > 0 {
		t.Errorf("the seed policy has warnings: %q", got)
	}
}

// An argument the policy reads that a tool's input schema does not declare
// is reported, against the tools the expression applies to; what cannot
// be told from the schema is not.
func TestLintArguments(t *testing.T) {
	p := mustParse(t, `
tools:
  - server: billing
    tool: refund
    effect: money_move
    constraints:
      - {name: cap, expr: "args.amount <= 250"}
      - {name: indexed, expr: "args['reason_code'] != 'fraud'"}
      - {name: flag, expr: "!has(args.force) || args.force == false"}
    budgets:
      - {name: daily, amount: args.amount, limit: 500, window: 24h}
  - {server: billing, tool: lookup_order, effect: read}
  - {server: billing, tool: composed, effect: read}
  - {server: billing, tool: open_ended, effect: read, constraints: [{name: anything, expr: "args.whatever == 1"}]}
  - {server: billing, tool: unlisted, effect: read, constraints: [{name: anything, expr: "args.whatever == 1"}]}
principals:
  - id: a
    grants:
      - server: billing
        tools: ["*"]
        constraints:
          - {name: region, expr: "args.region == 'eu'"}
          - {name: tested, expr: "!has(args.order_id) || args.order_id != ''"}
          - {name: tested_nowhere, expr: "!has(args.orderid) || args.orderid != ''"}
        budgets:
          - {name: total, amount: "has(args.amount_usd) ? args.amount_usd : 0", limit: 1000, window: 24h}
  - id: b
    grants:
      - server: billing
        tools: [lookup_order, refund]
        constraints:
          - {name: tested_nowhere, expr: "!has(args.orderid) || args.orderid != ''"}
          - {name: region, expr: "args.region == 'eu' && args.order_id != ''"}
`)
	schemas := map[string]string{
		"refund":       `{"type": "object", "properties": {"amount_usd": {"type": "number"}, "reason": {"type": "string"}, "region": {}}}`,
		"lookup_order": `{"type": "object", "properties": {"order_id": {"type": "string"}, "region": {}}, "additionalProperties": false}`,
		"composed":     `{"type": "object", "allOf": [{"properties": {"region": {}}}, {"anyOf": [{"properties": {"x": {}}}, true]}]}`,
		"open_ended":   `{"type": "object", "patternProperties": {"^w": {}}}`,
	}
	got := LintArguments(p, func(server, tool string) (json.RawMessage, bool) {
		s, ok := schemas[tool]
		return json.RawMessage(s), ok && server == "billing"
	})
	want := []string{
		"tools[0].budgets[0].amount: reads args.amount, which the input schema of billing/refund does not declare (it declares amount_usd, reason, region): every call is denied",
		"tools[0].constraints[0].expr: reads args.amount, which the input schema of billing/refund does not declare (it declares amount_usd, reason, region): every call is denied",
		"tools[0].constraints[1].expr: reads args.reason_code, which the input schema of billing/refund does not declare (it declares amount_usd, reason, region): every call is denied",
		"tools[0].constraints[2].expr: tests args.force, which the input schema of no tool it applies to (billing/refund) declares",
		// Some of the tools a's grant applies to may declare orderid.
		"principals[1].grants[0].constraints[0].expr: tests args.orderid, which the input schema of no tool it applies to (billing/lookup_order, billing/refund) declares",
		"principals[1].grants[0].constraints[1].expr: reads args.order_id, which the input schema of billing/refund does not declare (it declares amount_usd, reason, region): every call is denied",
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("LintArguments =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A server id the configuration lacks, and a classified tool its server
// does not list: each denies every call it was meant to allow, and passes
// every other check.
func TestLintServers(t *testing.T) {
	p := mustParse(t, `
tools:
  - {server: billing, tool: refund, effect: money_move}
  - {server: billing, tool: lookup_ordr, effect: read}
  - {server: billing, tool: archive, effect: write}
  - {server: biling, tool: refund, effect: money_move}
  - {server: crm, tool: notes, effect: read}
  - {server: shipping, tool: track, effect: read}
principals:
  - id: a
    grants:
      - {server: billing, tools: ["*"]}
      - {server: biling, tools: [refund]}
      - {server: payments, tools: ["*"]}
`)
	listed := map[string][]string{"billing": {"refund", "lookup_order"}}
	got := LintServers(p, []string{"billing", "crm", "shipping"}, func(server string) ([]string, bool) {
		names, ok := listed[server]
		return names, ok
	})
	want := []string{
		`tools[1]: billing/lookup_ordr is classified, but server billing does not list lookup_ordr (did you mean "lookup_order"?)`,
		`tools[2]: billing/archive is classified, but server billing does not list archive`,
		`tools[3]: server "biling" is not configured (did you mean "billing"?)`,
		`principals[0].grants[1]: server "biling" is not configured (did you mean "billing"?)`,
		`principals[0].grants[2]: server "payments" is not configured (servers are billing, crm, shipping)`,
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("LintServers =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
