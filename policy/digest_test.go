package policy

import (
	"flag"
	"fmt"
	"maps"
	"os"
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
		{"tool budget", []string{`message: "capped"}`, "message: \"capped\"}\n    budgets: [{name: daily, amount: args.amount, limit: 500, window: 24h}]"}, refunds},
		{"tool rate limit", []string{`message: "capped"}`, "message: \"capped\"}\n    rate_limits: [{name: burst, limit: 10, window: 1m}]"}, refunds},
		{"grant budget", []string{"capabilities: [payments.refund]\n  - id_prefix", "capabilities: [payments.refund]\n        budgets: [{name: daily, amount: '0', limit: 1, window: 1h}]\n  - id_prefix"}, agentOnly},
		{"grant rate limit", []string{"capabilities: [payments.refund]\n  - id_prefix", "capabilities: [payments.refund]\n        rate_limits: [{name: burst, limit: 10, window: 1m, per: principal}]\n  - id_prefix"}, agentOnly},
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

var update = flag.Bool("update", false, "rewrite testdata/digests.golden from the policies under testdata")

// The decision digests of the policies under testdata, pinned: a digest is
// in every snapshot, so one that moves drift-denies them all. The ones of
// policies without budgets or rate limits are the digests from before
// there were any; limits.yaml's include its limits, schedule.yaml's its
// schedules.
func TestDecisionDigestsGolden(t *testing.T) {
	const golden = "testdata/digests.golden"
	var b strings.Builder
	for _, file := range []string{"seed.yaml", "decide.yaml", "limits.yaml", "schedule.yaml"} {
		p := mustLoad(t, "testdata/"+file)
		for _, r := range p.rules() {
			for _, k := range slices.SortedFunc(maps.Keys(r.outcomes), compareKeys) {
				if o := r.outcomes[k]; o.granted {
					fmt.Fprintf(&b, "%s\t%s\t%s\t%s\n", file, r.name, k, o.decision.Digest)
				}
			}
		}
	}
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := mustRead(t, golden)
	if got := b.String(); got != want {
		t.Errorf("decision digests differ from %s (run with -update to accept, if no snapshot pins them):\n%s", golden, got)
	}
}

// A window is digested as counted: 24h and 1440m are one window, and a
// decision pinned under one holds under the other.
func TestDecisionDigestOfAWindowRespelled(t *testing.T) {
	src := mustRead(t, "testdata/limits.yaml")
	respelled := strings.ReplaceAll(strings.ReplaceAll(src, "window: 24h", "window: 1440m"), "window: 1m", "window: 60s")
	if respelled == src {
		t.Fatal("limits.yaml has no window to respell")
	}
	a, b := mustParse(t, src), mustParse(t, respelled)
	for _, k := range []struct{ server, tool string }{{"billing", "refund"}, {"payments", "refund"}} {
		if da, db := decide(t, a, support, k.server, k.tool).Digest, decide(t, b, support, k.server, k.tool).Digest; da != db {
			t.Errorf("%s/%s: digest %s with the windows respelled, %s before", k.server, k.tool, db, da)
		}
	}
}
