package policy

import (
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
		"principals[2].grants[1].constraints[0]: reads args.amount but applies to each of lookup_order, purge, refund; a call without amount is denied (guard it with has(args.amount), or move it to the tool)",
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
