package policy

import (
	"slices"
	"strings"
	"testing"
)

// digestBase has two tools decided for two principal rules, so that each
// edit below can be seen to move exactly the digests it should.
const digestBase = `
lockfile: a.lock
tools:
  - server: billing
    tool: refund
    effect: money_move
    capabilities: [payments.refund]
    after: [lookup_order]
    constraints:
      - {name: cap, expr: "args.amount <= 250", message: "capped"}
  - {server: billing, tool: lookup_order, effect: read}
principals:
  - id: agent
    grants:
      - server: billing
        tools: [refund, lookup_order]
        max_effect: money_move
        capabilities: [payments.refund]
  - id_prefix: "spiffe://acme/"
    grants:
      - {server: billing, tools: ["*"], capabilities: [payments.refund]}
`

type decisionKey struct{ principal, tool string }

var digestDecisions = []decisionKey{
	{"agent", "refund"}, {"agent", "lookup_order"},
	{"spiffe://acme/x", "refund"}, {"spiffe://acme/x", "lookup_order"},
}

func digests(t *testing.T, src string) map[decisionKey]string {
	t.Helper()
	p := mustParse(t, src)
	out := map[decisionKey]string{}
	for _, k := range digestDecisions {
		d, err := p.Decide(k.principal, "billing", k.tool)
		if err != nil {
			t.Fatalf("Decide(%v): %v", k, err)
		}
		out[k] = d.Digest
	}
	return out
}

func TestDecisionDigestIsPerRule(t *testing.T) {
	base := digests(t, digestBase)
	seen := map[string]decisionKey{}
	for k, d := range base {
		if prev, dup := seen[d]; dup {
			t.Errorf("%v and %v share digest %s", prev, k, d)
		}
		seen[d] = k
	}
	refunds := []decisionKey{{"agent", "refund"}, {"spiffe://acme/x", "refund"}}
	agentOnly := []decisionKey{{"agent", "refund"}, {"agent", "lookup_order"}}
	tests := []struct {
		name    string
		edits   []string      // from, to, from, to...
		changed []decisionKey // every other decision must keep its digest
	}{
		{"tool effect", []string{"effect: money_move\n    capabilities", "effect: write\n    capabilities"}, refunds},
		{"tool constraint expr", []string{"args.amount <= 250", "args.amount <= 300"}, refunds},
		{"tool constraint message", []string{`message: "capped"`, `message: "capped at 250"`}, refunds},
		{"tool capabilities", []string{"capabilities: [payments.refund]\n    after", "capabilities: []\n    after"}, refunds},
		{"tool after", []string{"after: [lookup_order]", "after: []"}, refunds},
		{"grant max_effect", []string{"max_effect: money_move", "max_effect: admin"}, agentOnly},
		{"grant capabilities", []string{"capabilities: [payments.refund]\n  - id_prefix", "capabilities: [payments.refund, x]\n  - id_prefix"}, agentOnly},
		{"grant constraint", []string{"capabilities: [payments.refund]\n  - id_prefix", "capabilities: [payments.refund]\n        constraints: [{name: c, expr: 'true'}]\n  - id_prefix"}, agentOnly},
		{"exact id becomes a prefix", []string{"  - id: agent\n", "  - id_prefix: agent\n"}, agentOnly},
		{"named becomes wildcard", []string{"tools: [refund, lookup_order]", `tools: ["*"]`}, agentOnly},
		// Neither changes any decision's rules.
		{"another tool classified and granted", []string{
			"  - {server: billing, tool: lookup_order, effect: read}\n", "  - {server: billing, tool: lookup_order, effect: read}\n  - {server: billing, tool: cancel, effect: write}\n",
			"tools: [refund, lookup_order]", "tools: [refund, lookup_order, cancel]",
		}, nil},
		{"lockfile", []string{"lockfile: a.lock", "lockfile: b.lock"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := digestBase
			for i := 0; i < len(tt.edits); i += 2 {
				if !strings.Contains(src, tt.edits[i]) {
					t.Fatalf("base has no %q", tt.edits[i])
				}
				src = strings.Replace(src, tt.edits[i], tt.edits[i+1], 1)
			}
			got := digests(t, src)
			for _, k := range digestDecisions {
				want := slices.Contains(tt.changed, k)
				if changed := got[k] != base[k]; changed != want {
					t.Errorf("%v: digest changed = %v, want %v", k, changed, want)
				}
			}
		})
	}
}

// Rule order in the file is not part of any decision.
func TestDecisionDigestIgnoresOrder(t *testing.T) {
	reordered := `
lockfile: a.lock
principals:
  - id_prefix: "spiffe://acme/"
    grants:
      - {server: billing, tools: ["*"], capabilities: [payments.refund]}
  - id: agent
    grants:
      - server: billing
        max_effect: money_move
        capabilities: [payments.refund, payments.refund]
        tools: [lookup_order, refund]
tools:
  - {server: billing, tool: lookup_order, effect: read}
  - server: billing
    tool: refund
    constraints:
      - {message: "capped", expr: "args.amount <= 250", name: cap}
    after: [lookup_order, lookup_order]
    capabilities: [payments.refund]
    effect: money_move
`
	base, got := digests(t, digestBase), digests(t, reordered)
	for _, k := range digestDecisions {
		if base[k] != got[k] {
			t.Errorf("%v: reordering changed the digest", k)
		}
	}
	if mustParse(t, digestBase).Digest() == mustParse(t, strings.Replace(digestBase, "a.lock", "b.lock", 1)).Digest() {
		t.Error("the whole-policy digest ignores the lockfile")
	}
}
