package policy

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// looseBase is the policy in force in every Loosenings case; each case
// edits it and says what the reload must report.
const looseBase = `
lockfile: capsnap.lock
tools:
  - {server: billing, tool: lookup_order, effect: read}
  - {server: billing, tool: update_address, effect: write}
  - server: billing
    tool: refund
    effect: money_move
    capabilities: [payments.refund]
    after: [lookup_order]
    constraints:
      - {name: usd_cap_250, expr: "args.amount <= 250", message: "capped at USD 250"}
      - {name: reason_allowlist, expr: "args.reason_code in ['duplicate_charge', 'damaged']"}
  - {server: billing, tool: refund_large, effect: money_move, capabilities: [payments.refund, payments.large]}
principals:
  - id: spiffe://acme/agent/support-refund
    grants:
      - server: billing
        tools: [lookup_order, refund, refund_large]
        max_effect: money_move
        capabilities: [payments.refund]
        constraints:
          - {name: business_hours, expr: "principal != ''"}
  - id: spiffe://acme/agent/support-readonly
    grants:
      - {server: billing, tools: ["*"], max_effect: read}
  - id_prefix: spiffe://acme/agent/
    grants:
      - {server: billing, tools: [lookup_order]}
  - id_prefix: spiffe://acme/agent/batch/
    grants: []
`

// supportRule is looseBase's rule for the support agent, whole.
const supportRule = `  - id: spiffe://acme/agent/support-refund
    grants:
      - server: billing
        tools: [lookup_order, refund, refund_large]
        max_effect: money_move
        capabilities: [payments.refund]
        constraints:
          - {name: business_hours, expr: "principal != ''"}
`

func TestLoosenings(t *testing.T) {
	const (
		support  = `principal "spiffe://acme/agent/support-refund"`
		readonly = `principal "spiffe://acme/agent/support-readonly"`
		agents   = `principals under "spiffe://acme/agent/"`
		batch    = `principals under "spiffe://acme/agent/batch/"`
	)
	runLoosenings(t, looseBase, []looseCase{
		// Loosening, each kind.
		{"cap raised", []string{"args.amount <= 250", "args.amount <= 500"},
			[]string{support + `: billing/refund: constraint "usd_cap_250" changed from "args.amount <= 250" to "args.amount <= 500"`}},
		{"cap lowered: any changed expression counts", []string{"args.amount <= 250", "args.amount <= 100"},
			[]string{`constraint "usd_cap_250" changed`}},
		{"constraint message changed", []string{`message: "capped at USD 250"`, `message: "capped"`},
			[]string{`billing/refund: constraint "usd_cap_250" message changed from "capped at USD 250" to "capped"`}},
		{"constraint removed", []string{"      - {name: reason_allowlist, expr: \"args.reason_code in ['duplicate_charge', 'damaged']\"}\n", ""},
			[]string{support + `: billing/refund: constraint "reason_allowlist" (args.reason_code in ['duplicate_charge', 'damaged']) removed`}},
		{"constraint renamed", []string{"name: usd_cap_250", "name: cap"},
			[]string{`constraint "usd_cap_250" (args.amount <= 250) removed`}},
		{"grant constraint removed", []string{"        constraints:\n          - {name: business_hours, expr: \"principal != ''\"}\n", ""},
			[]string{support + `: billing/lookup_order: constraint "business_hours"`, support + `: billing/refund: constraint "business_hours"`}},
		{"after removed", []string{"after: [lookup_order]", "after: []"},
			[]string{support + ": billing/refund: no longer requires lookup_order first"}},
		{"new grant", []string{"tools: [lookup_order]}", "tools: [lookup_order, update_address]}"},
			[]string{agents + ": may now call billing/update_address under id_prefix:spiffe://acme/agent/ (before, id_prefix:spiffe://acme/agent/: it is in no grant)"}},
		{"new exact rule", []string{"principals:\n", "principals:\n  - id: spiffe://acme/ci\n    grants: [{server: billing, tools: [lookup_order]}]\n"},
			[]string{`principal "spiffe://acme/ci": may now call billing/lookup_order under id:spiffe://acme/ci (before, no principal rule matched)`}},
		{"new prefix rule", []string{"principals:\n", "principals:\n  - id_prefix: spiffe://acme/agent/ops-\n    grants: [{server: billing, tools: [update_address]}]\n"},
			[]string{`principals under "spiffe://acme/agent/ops-": may now call billing/update_address`}},
		{"rule for everyone under a new prefix", []string{"principals:\n", "principals:\n  - id_prefix: spiffe://\n    grants: [{server: billing, tools: [lookup_order]}]\n"},
			[]string{`principals under "spiffe://": may now call billing/lookup_order`}},
		{"higher max_effect", []string{`tools: ["*"], max_effect: read`, `tools: ["*"], max_effect: write`},
			[]string{readonly + ": may now call billing/update_address under id:spiffe://acme/agent/support-readonly (before, id:spiffe://acme/agent/support-readonly: it is write, above its grant's max_effect read)"}},
		{"max_effect dropped", []string{`tools: ["*"], max_effect: read`, `tools: ["*"]`},
			[]string{readonly + ": may now call billing/update_address under"}},
		{"grant capability added", []string{"capabilities: [payments.refund]\n        constraints", "capabilities: [payments.refund, payments.large]\n        constraints"},
			[]string{support + ": may now call billing/refund_large under id:", "its grant lacks capabilities payments.large"}},
		{"tool capability requirement removed", []string{"capabilities: [payments.refund, payments.large]", "capabilities: [payments.refund]"},
			[]string{support + ": may now call billing/refund_large"}},
		{"newly classified tool under *", []string{"principals:\n", "  - {server: billing, tool: list_orders, effect: read}\nprincipals:\n"},
			[]string{readonly + ": may now call billing/list_orders", "(before, the tool was not classified)"}},
		{"effect class lowered", []string{"tool: update_address, effect: write", "tool: update_address, effect: read"},
			[]string{"billing/update_address: effect class lowered from write to read", readonly + ": may now call billing/update_address"}},
		{"effect class lowered, still granted", []string{"effect: money_move\n    capabilities: [payments.refund]\n    after", "effect: write\n    capabilities: [payments.refund]\n    after"},
			[]string{"billing/refund: effect class lowered from money_move to write"}},
		{"exact rule removed: the broader prefix decides, on looser terms", []string{supportRule, ""},
			[]string{support + `: billing/lookup_order: constraint "business_hours" (principal != '') removed`}},
		{"exact id becomes a prefix", []string{"  - id: spiffe://acme/agent/support-refund\n", "  - id_prefix: spiffe://acme/agent/support-refund\n"},
			[]string{`principals under "spiffe://acme/agent/support-refund": may now call billing/refund under id_prefix:spiffe://acme/agent/support-refund`}},
		{"narrow prefix rule removed: the broad one now decides", []string{"  - id_prefix: spiffe://acme/agent/batch/\n    grants: []\n", ""},
			[]string{batch + ": may now call billing/lookup_order under id_prefix:spiffe://acme/agent/ (before, id_prefix:spiffe://acme/agent/batch/: it is in no grant)"}},
		{"narrower exact rule that grants more", []string{"principals:\n", "principals:\n  - id: spiffe://acme/agent/batch/7\n    grants: [{server: billing, tools: [lookup_order]}]\n"},
			[]string{`principal "spiffe://acme/agent/batch/7": may now call billing/lookup_order`}},
		{"lockfile removed", []string{"lockfile: capsnap.lock\n", ""},
			[]string{"lockfile: removed (was capsnap.lock)"}},
		{"lockfile elsewhere", []string{"lockfile: capsnap.lock", "lockfile: other.lock"},
			[]string{"lockfile: now other.lock (was capsnap.lock)"}},

		// Not loosening.
		{"identical", nil, nil},
		{"grant removed", []string{"      - {server: billing, tools: [lookup_order]}\n", ""}, nil},
		{"tool named no more", []string{"tools: [lookup_order, refund, refund_large]", "tools: [lookup_order, refund]"}, nil},
		{"tool declassified", []string{"  - {server: billing, tool: refund_large, effect: money_move, capabilities: [payments.refund, payments.large]}\n", "", "tools: [lookup_order, refund, refund_large]", "tools: [lookup_order, refund]"}, nil},
		{"constraint added", []string{"      - {name: reason_allowlist", "      - {name: order_id, expr: \"size(args.order_id) < 20\"}\n      - {name: reason_allowlist"}, nil},
		{"constraint moved from the tool to the grant", []string{
			"      - {name: usd_cap_250, expr: \"args.amount <= 250\", message: \"capped at USD 250\"}\n", "",
			"          - {name: business_hours", "          - {name: usd_cap_250, expr: \"args.amount <= 250\", message: \"capped at USD 250\"}\n          - {name: business_hours",
		}, nil},
		{"constraints reordered", []string{
			"      - {name: usd_cap_250, expr: \"args.amount <= 250\", message: \"capped at USD 250\"}\n", "",
			"'damaged']\"}\n", "'damaged']\"}\n      - {name: usd_cap_250, expr: \"args.amount <= 250\", message: \"capped at USD 250\"}\n",
		}, nil},
		{"lower max_effect", []string{"max_effect: money_move", "max_effect: read"}, nil},
		{"after added", []string{"tool: update_address, effect: write}", "tool: update_address, effect: write, after: [lookup_order]}"}, nil},
		{"tool capability required", []string{"tool: update_address, effect: write}", "tool: update_address, effect: write, capabilities: [crm.write]}"}, nil},
		{"effect class raised", []string{"tool: update_address, effect: write", "tool: update_address, effect: admin"}, nil},
		{"grant capability removed", []string{"capabilities: [payments.refund]\n        constraints", "capabilities: []\n        constraints"}, nil},
		// The prefix that now decides grants only what the rule did.
		{"exact rule removed: the prefix grants no more", []string{"  - id: spiffe://acme/agent/support-readonly\n    grants:\n      - {server: billing, tools: [\"*\"], max_effect: read}\n", ""}, nil},
	})
}

// A budget or rate limit that allows more, by name on the tool or the
// grant, is loosening; one that allows less is not.
func TestLooseningsOfLimits(t *testing.T) {
	const refund = `principal "spiffe://acme/agent/support-refund": billing/refund: `
	runLoosenings(t, mustRead(t, "testdata/limits.yaml"), []looseCase{
		{"budget limit raised", []string{"amount: args.amount, limit: 500", "amount: args.amount, limit: 1000"},
			[]string{refund + `budget "daily_refunds" limit raised from 500 to 1000`}},
		{"budget window shortened", []string{"limit: 500, window: 24h}\n    rate", "limit: 500, window: 1h}\n    rate"},
			[]string{refund + `budget "daily_refunds" window shortened from 24h to 1h`}},
		{"budget removed", []string{"      - {name: daily_refunds, amount: args.amount, limit: 500, window: 24h}\n", ""},
			[]string{refund + `budget "daily_refunds" (500 per 24h, per principal, on the tool) removed`}},
		{"budget renamed: a new counter, from nothing", []string{"name: daily_refunds, amount: args.amount", "name: refunds_today, amount: args.amount"},
			[]string{refund + `budget "daily_refunds" (500 per 24h, per principal, on the tool) removed`}},
		{"budget amount changed", []string{"amount: args.amount, limit: 500", "amount: args.amount / 2.0, limit: 500"},
			[]string{refund + `budget "daily_refunds" amount changed from "args.amount" to "args.amount / 2.0"`}},
		{"budget moved from the tool to the grant", []string{
			"      - {name: daily_refunds, amount: args.amount, limit: 500, window: 24h}\n", "",
			"        budgets:\n          - {name: money_out, amount: \"has(args.amount)", "        budgets:\n          - {name: daily_refunds, amount: args.amount, limit: 500, window: 24h}\n          - {name: money_out, amount: \"has(args.amount)",
		}, []string{refund + `budget "daily_refunds" (500 per 24h, per principal, on the tool) removed`}},
		{"grant budget raised on both its grants", []string{"limit: 2000, window: 24h", "limit: 3000, window: 24h", "limit: 2000, window: 1440m", "limit: 3000, window: 1440m"},
			[]string{refund + `budget "money_out" limit raised from 2000 to 3000`, `payments/refund: budget "money_out" limit raised`}},
		{"rate limit raised", []string{"limit: 10, window: 1m", "limit: 20, window: 1m"},
			[]string{refund + `rate limit "refund_burst" limit raised from 10 to 20`}},
		{"rate limit window shortened", []string{"limit: 10, window: 1m", "limit: 10, window: 30s"},
			[]string{refund + `rate limit "refund_burst" window shortened from 1m to 30s`}},
		{"rate limit removed", []string{"    rate_limits:\n      - {name: refund_burst, limit: 10, window: 1m}\n", ""},
			[]string{refund + `rate limit "refund_burst" (10 calls per 1m, per principal, on the tool) removed`}},
		{"rate limit counted per tool", []string{"per: principal", "per: tool"},
			[]string{refund + `rate limit "billing_calls" now counts each tool apart, not all together`}},

		// Not loosening.
		{"budget limit lowered", []string{"amount: args.amount, limit: 500", "amount: args.amount, limit: 400"}, nil},
		{"budget window widened", []string{"limit: 500, window: 24h}\n    rate", "limit: 500, window: 48h}\n    rate"}, nil},
		{"window respelled", []string{"limit: 500, window: 24h}\n    rate", "limit: 500, window: 1440m}\n    rate"}, nil},
		{"budget added", []string{"    rate_limits:\n      - {name: refund_burst", "      - {name: weekly, amount: args.amount, limit: 2000, window: 168h}\n    rate_limits:\n      - {name: refund_burst"}, nil},
		{"rate limit counted per principal", []string{"{name: per_tool, limit: 5, window: 10s}", "{name: per_tool, limit: 5, window: 10s, per: principal}"}, nil},
	})
}

type looseCase struct {
	name  string
	edits []string // from, to, from, to...: applied to the base
	// want are substrings, each of which some reported line must
	// contain; none means the new policy must not be looser at all.
	want []string
}

// runLoosenings edits base as each case says and holds Loosenings from
// base to the edit to the case.
func runLoosenings(t *testing.T, base string, tests []looseCase) {
	t.Helper()
	old := mustParse(t, base)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := base
			for i := 0; i < len(tt.edits); i += 2 {
				if !strings.Contains(src, tt.edits[i]) {
					t.Fatalf("base has no %q", tt.edits[i])
				}
				src = strings.Replace(src, tt.edits[i], tt.edits[i+1], 1)
			}
			got := Loosenings(old, mustParse(t, src))
			if len(tt.want) == 0 && len(got) > 0 {
				t.Fatalf("not looser, but Loosenings reports:\n%s", strings.Join(got, "\n"))
			}
			for _, w := range tt.want {
				if !slices.ContainsFunc(got, func(line string) bool { return strings.Contains(line, w) }) {
					t.Errorf("no line contains %q; got:\n%s", w, strings.Join(got, "\n"))
				}
			}
			if !slices.IsSorted(got) {
				t.Errorf("not sorted: %q", got)
			}
		})
	}
}

// The exact lines for the attack the seed names: a reload that raises the
// cap. One line per principal the change reaches, nothing else.
func TestLooseningsCapRaisedExactly(t *testing.T) {
	old := mustLoad(t, "testdata/seed.yaml")
	next := mustParse(t, strings.ReplaceAll(mustRead(t, "testdata/seed.yaml"), "args.amount <= 250", "args.amount <= 500"))
	want := []string{
		`principal "spiffe://acme/agent/support-refund": billing/refund: constraint "usd_cap_250" changed from "args.amount <= 250" to "args.amount <= 500"`,
		`principal "spiffe://acme/agent/support-refund": payments/refund: constraint "usd_cap_250" changed from "args.amount <= 250" to "args.amount <= 500"`,
	}
	if got := Loosenings(old, next); !slices.Equal(got, want) {
		t.Errorf("Loosenings =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// And back again is just as much a change.
	if got := Loosenings(next, old); len(got) != 2 {
		t.Errorf("lowering the cap back: %q", got)
	}
}

// Rule order is not meaning: a shuffled copy is not looser either way.
func TestLooseningsReordered(t *testing.T) {
	reordered := `
principals:
  - id_prefix: spiffe://acme/agent/batch/
    grants: []
  - id_prefix: spiffe://acme/agent/
    grants:
      - {server: billing, tools: [lookup_order]}
  - id: spiffe://acme/agent/support-readonly
    grants:
      - {server: billing, tools: ["*"], max_effect: read}
  - id: spiffe://acme/agent/support-refund
    grants:
      - server: billing
        capabilities: [payments.refund]
        max_effect: money_move
        tools: [refund_large, refund, lookup_order]
        constraints:
          - {name: business_hours, expr: "principal != ''"}
tools:
  - {server: billing, tool: refund_large, effect: money_move, capabilities: [payments.large, payments.refund]}
  - server: billing
    tool: refund
    effect: money_move
    capabilities: [payments.refund]
    after: [lookup_order]
    constraints:
      - {name: reason_allowlist, expr: "args.reason_code in ['duplicate_charge', 'damaged']"}
      - {name: usd_cap_250, expr: "args.amount <= 250", message: "capped at USD 250"}
  - {server: billing, tool: update_address, effect: write}
  - {server: billing, tool: lookup_order, effect: read}
lockfile: capsnap.lock
`
	a, b := mustParse(t, looseBase), mustParse(t, reordered)
	if got := Loosenings(a, b); len(got) > 0 {
		t.Errorf("reordered is looser: %q", got)
	}
	if got := Loosenings(b, a); len(got) > 0 {
		t.Errorf("reordered is tighter: %q", got)
	}
	for _, p := range []*Policy{a, b, mustLoad(t, "testdata/seed.yaml"), mustLoad(t, "testdata/decide.yaml")} {
		if got := Loosenings(p, p); len(got) > 0 {
			t.Errorf("a policy is looser than itself: %q", got)
		}
	}
}

func mustRead(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestLooseningsWholeFile(t *testing.T) {
	base := mustParse(t, looseBase)
	bare := mustParse(t, "lockfile: capsnap.lock\ntools: []\n")
	if got := Loosenings(base, bare); len(got) > 0 {
		t.Errorf("denying everything is looser: %q", got)
	}
	if got := Loosenings(bare, base); len(got) == 0 {
		t.Error("granting something where nothing was is not reported")
	}
	// A lockfile where there was none admits fewer tools, not more.
	noLock := mustParse(t, strings.Replace(looseBase, "lockfile: capsnap.lock\n", "", 1))
	if got := Loosenings(noLock, base); len(got) > 0 {
		t.Errorf("adding a lockfile is looser: %q", got)
	}
}

func TestLooseningsOfApproval(t *testing.T) {
	const refund = `principal "spiffe://acme/agent/support-refund": billing/refund: `
	runLoosenings(t, mustRead(t, "testdata/approval.yaml"), []looseCase{
		{"approval removed", []string{"    approval:\n      when: \"args.amount > 100\"\n      approvers: [\"alice@acme.example\", \"group:oncall\"]\n      ttl: 10m\n", ""},
			[]string{refund + `approval (tools[0].approval when args.amount > 100, approvers alice@acme.example, group:oncall) removed`}},
		{"condition changed", []string{"args.amount > 100", "args.amount > 500"}, []string{refund + `approval needed when "args.amount > 500", was "args.amount > 100"`}},
		{"an approver added", []string{`"group:oncall"]`, `"group:oncall", "bob@acme.example"]`}, []string{refund + `approval may now be given by bob@acme.example`}},
		{"self-approval", []string{"ttl: 10m\n", "ttl: 10m\n      self_approve: true\n"}, []string{refund + `approval may now be given by the caller itself`}},
		{"a longer life", []string{"ttl: 10m", "ttl: 1h"}, []string{refund + `an approval now lives 1h0m0s, was 10m0s`}},

		// Not loosening.
		{"an approver removed", []string{`, "group:oncall"]`, `]`}, nil},
		{"a shorter life", []string{"ttl: 10m", "ttl: 5m"}, nil},
	})
}
