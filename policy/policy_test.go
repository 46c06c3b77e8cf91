package policy

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/deny"
)

func TestLoadInvalid(t *testing.T) {
	f, err := os.Open("testdata/invalid/want.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, want, _ := strings.Cut(sc.Text(), "\t")
		seen++
		t.Run(name, func(t *testing.T) {
			_, err := Load(filepath.Join("testdata/invalid", name+".yaml"))
			if err == nil {
				t.Fatalf("Load succeeded, want error containing %q", want)
			}
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not contain %q", err, want)
			}
		})
	}
	files, _ := filepath.Glob("testdata/invalid/*.yaml")
	if seen != len(files) {
		t.Fatalf("want.txt lists %d cases, testdata/invalid has %d files", seen, len(files))
	}
}

func mustLoad(t testing.TB, path string) *Policy {
	t.Helper()
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustParse(t testing.TB, src string) *Policy {
	t.Helper()
	p, err := Parse([]byte(src))
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, src)
	}
	return p
}

func TestDecide(t *testing.T) {
	const (
		support  = "spiffe://acme/agent/support-refund"
		auditor  = "spiffe://acme/agent/auditor"
		agent    = "id_prefix:spiffe://acme/agent/"
		ops      = "id_prefix:spiffe://acme/agent/ops-"
		readonly = "id_prefix:spiffe://acme/agent/ops-readonly"
	)
	tests := []struct {
		file, principal, server, tool string
		effect                        EffectClass
		rule                          string
		reason                        deny.Reason
		detail                        string // in the denial
	}{
		// The minimal policy: named grants and "*".
		{"valid", support, "billing", "refund", MoneyMove, "id:" + support, "", ""},
		{"valid", support, "billing", "lookup_order", Read, "id:" + support, "", ""},
		{"valid", auditor, "billing", "refund", MoneyMove, "id:" + auditor, "", ""},
		{"valid", support, "files", "read_file", 0, "", deny.ToolNotGranted, "it is in no grant"},
		{"valid", "spiffe://acme/agent/other", "billing", "refund", 0, "", deny.ToolNotGranted, "no principal rule matches"},
		{"valid", support, "billing", "delete_everything", 0, "", deny.UnclassifiedTool, "billing/delete_everything no effect class"},
		{"valid", auditor, "billing", "new_tool", 0, "", deny.UnclassifiedTool, ""},
		// Same tool name on another server is another tool.
		{"valid", support, "files", "refund", 0, "", deny.UnclassifiedTool, ""},

		// Exact id: its rule alone applies, the prefix rule is not merged in.
		{"decide", support, "billing", "refund", MoneyMove, "id:" + support, "", ""},
		{"decide", support, "billing", "lookup_order", Read, "id:" + support, "", ""},
		{"decide", support, "billing", "update_address", 0, "", deny.ToolNotGranted, `principal "` + support + `" (rule id:` + support + ") is not granted billing/update_address: it is in no grant"},
		// Capability subset: refund_large needs payments.large too.
		{"decide", support, "billing", "refund_large", 0, "", deny.ToolNotGranted, "its grant lacks capabilities payments.large"},
		// Prefix: the ceiling write admits read and write, not money_move.
		{"decide", "spiffe://acme/agent/triage", "billing", "lookup_order", Read, agent, "", ""},
		{"decide", "spiffe://acme/agent/triage", "billing", "update_address", Write, agent, "", ""},
		{"decide", "spiffe://acme/agent/triage", "billing", "refund", 0, "", deny.ToolNotGranted, "it is money_move, above its grant's max_effect write"},
		{"decide", "spiffe://acme/agent/triage", "billing", "purge", 0, "", deny.ToolNotGranted, "admin, above its grant's max_effect write"},
		{"decide", "spiffe://acme/agent/", "billing", "lookup_order", Read, agent, "", ""},
		// Longest prefix wins, and only it applies.
		{"decide", "spiffe://acme/agent/ops-1", "billing", "refund_large", MoneyMove, ops, "", ""},
		{"decide", "spiffe://acme/agent/ops-1", "billing", "purge", Admin, ops, "", ""},
		{"decide", "spiffe://acme/agent/ops-1", "billing", "lookup_order", Read, ops, "", ""},
		{"decide", "spiffe://acme/agent/ops-1", "files", "read_file", 0, "", deny.ToolNotGranted, "its grant lacks capabilities fs.read"},
		{"decide", "spiffe://acme/agent/ops-readonly-7", "billing", "lookup_order", Read, readonly, "", ""},
		{"decide", "spiffe://acme/agent/ops-readonly-7", "billing", "update_address", 0, "", deny.ToolNotGranted, "(rule " + readonly + ")"},
		// An empty exact rule denies; it does not fall back to the prefix.
		{"decide", "spiffe://acme/agent/locked", "billing", "lookup_order", 0, "", deny.ToolNotGranted, "it is in no grant"},
		// A prefix is not a substring match, nor is it matched the other way.
		{"decide", "spiffe://acme/agent", "billing", "lookup_order", 0, "", deny.ToolNotGranted, "no principal rule matches"},
		{"decide", "spiffe://other/spiffe://acme/agent/x", "billing", "lookup_order", 0, "", deny.ToolNotGranted, "no principal rule matches"},
		// Unclassified comes first, whoever asks.
		{"decide", "spiffe://acme/agent/ops-1", "billing", "delete_everything", 0, "", deny.UnclassifiedTool, ""},
		{"decide", "nobody", "files", "write_file", 0, "", deny.UnclassifiedTool, ""},
	}
	policies := map[string]*Policy{}
	// One Principal per file and principal decides all their rows, each
	// held to the row as Decide is: its quoted name is made once.
	principals := map[[2]string]*Principal{}
	for _, tt := range tests {
		p, ok := policies[tt.file]
		if !ok {
			p = mustLoad(t, "testdata/"+tt.file+".yaml")
			policies[tt.file] = p
		}
		k := [2]string{tt.file, tt.principal}
		if principals[k] == nil {
			principals[k] = p.For(tt.principal)
		}
		for how, decide := range map[string]func() (Decision, error){
			"Decide":       func() (Decision, error) { return p.Decide(tt.principal, tt.server, tt.tool) },
			"For().Decide": func() (Decision, error) { return principals[k].Decide(tt.server, tt.tool) },
		} {
			d, err := decide()
			if tt.reason != "" {
				de, ok := deny.As(err)
				if !ok || de.Reason != tt.reason || !strings.Contains(de.Detail, tt.detail) {
					t.Errorf("%s: %s(%s, %s, %s) = %v, want %s containing %q", tt.file, how, tt.principal, tt.server, tt.tool, err, tt.reason, tt.detail)
				}
				continue
			}
			if err != nil || d.Effect != tt.effect || d.Rule != tt.rule || !strings.HasPrefix(d.Digest, "sha256:") {
				t.Errorf("%s: %s(%s, %s, %s) = %+v, %v; want effect %v by %s", tt.file, how, tt.principal, tt.server, tt.tool, d, err, tt.effect, tt.rule)
			}
		}
	}
}

func TestAllowed(t *testing.T) {
	p := mustLoad(t, "testdata/decide.yaml")
	tests := []struct {
		principal, server string
		want              []string
	}{
		{"spiffe://acme/agent/support-refund", "billing", []string{"lookup_order", "refund"}},
		{"spiffe://acme/agent/triage", "billing", []string{"lookup_order", "update_address"}},
		{"spiffe://acme/agent/ops-1", "billing", []string{"lookup_order", "purge", "refund", "refund_large", "update_address"}},
		{"spiffe://acme/agent/ops-1", "files", nil},
		{"spiffe://acme/agent/locked", "billing", nil},
		{"nobody", "billing", nil},
	}
	for _, tt := range tests {
		got := p.Allowed(tt.principal, tt.server)
		if !slices.Equal(got, tt.want) {
			t.Errorf("Allowed(%s, %s) = %v, want %v", tt.principal, tt.server, got, tt.want)
		}
	}
	// The result is the caller's to keep.
	got := p.Allowed("spiffe://acme/agent/triage", "billing")
	got[0] = "mutated"
	if again := p.Allowed("spiffe://acme/agent/triage", "billing"); again[0] != "lookup_order" {
		t.Errorf("Allowed shares its slice with the policy: %v", again)
	}
}

// The seed's worked example, as testdata/seed.yaml states it.
func TestSeedPolicy(t *testing.T) {
	p := mustLoad(t, "testdata/seed.yaml")
	const support, readonly = "spiffe://acme/agent/support-refund", "spiffe://acme/agent/support-readonly"

	d, err := p.Decide(support, "billing", "refund")
	if err != nil {
		t.Fatal(err)
	}
	if d.Effect != MoneyMove || !slices.Equal(afterOf(d), []string{"lookup_order"}) || !slices.Equal(d.Capabilities, []string{"payments.refund"}) {
		t.Errorf("billing/refund decision = %+v", d)
	}
	// Calls to lookup_order are recorded for refund's rule; no other
	// tool's are.
	if precedesOf(d) {
		t.Error("refund precedes nothing, but its decision says it does")
	}
	if lookup, err := p.Decide(support, "billing", "lookup_order"); err != nil || !precedesOf(lookup) {
		t.Errorf("billing/lookup_order decision = %+v, %v; want Precedes", lookup, err)
	}
	var names []string
	for _, c := range constraintsOf(d) {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, []string{"usd_cap_250", "reason_allowlist"}) {
		t.Errorf("constraints = %v", names)
	}
	check := func(args map[string]any) error {
		for _, c := range constraintsOf(d) {
			if err := c.CheckInput(Input{Args: args, Principal: support, Server: "billing", Tool: "refund"}); err != nil {
				return err
			}
		}
		return nil
	}
	if err := check(map[string]any{"order_id": "A-100", "amount": 40.0, "reason_code": "duplicate_charge"}); err != nil {
		t.Errorf("turn 1 refund denied: %v", err)
	}
	if err := check(map[string]any{"order_id": "A-100", "amount": 250.01, "reason_code": "duplicate_charge"}); err == nil {
		t.Error("USD 250.01 allowed")
	}
	if err := check(map[string]any{"order_id": "A-100", "amount": 40.0, "reason_code": "vip_escalation"}); err == nil {
		t.Error("reason outside the allowlist allowed")
	}

	if got := p.Allowed(readonly, "billing"); !slices.Equal(got, []string{"lookup_order"}) {
		t.Errorf("read-only agent may call %v", got)
	}
	if _, err := p.Decide(readonly, "billing", "refund"); err == nil {
		t.Error("read-only agent may refund")
	}
	pd, err := p.Decide(support, "payments", "refund")
	if err != nil || pd.Effect != MoneyMove || len(constraintsOf(pd)) != 1 || constraintsOf(pd)[0].Name != "usd_cap_250" {
		t.Errorf("payments/refund = %+v, %v", pd, err)
	}
	if _, err := p.Decide(readonly, "payments", "refund"); err == nil {
		t.Error("read-only agent may refund through payments")
	}
	if w := Lint(p); len(w) != 0 {
		t.Errorf("the seed policy has lint warnings: %q", w)
	}
}

func TestDecisionTerms(t *testing.T) {
	p := mustParse(t, `
tools:
  - {server: s, tool: a, effect: read}
  - {server: s, tool: b, effect: read}
  - server: s
    tool: t
    effect: write
    capabilities: [z.cap, a.cap, z.cap]
    after: [b, a, b]
    constraints:
      - {name: one, expr: "true"}
      - {name: two, expr: "true"}
principals:
  - id: p
    grants:
      - server: s
        tools: [t]
        capabilities: [a.cap, z.cap]
        constraints:
          - {name: three, expr: "true"}
          - {name: one, expr: "tool == 't'"}
`)
	d, err := p.Decide("p", "s", "t")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range constraintsOf(d) {
		names = append(names, c.Name+"="+c.Expr)
	}
	// The tool's, then the grant's, each in file order.
	if want := []string{"one=true", "two=true", "three=true", "one=tool == 't'"}; !slices.Equal(names, want) {
		t.Errorf("constraints = %v, want %v", names, want)
	}
	if !slices.Equal(afterOf(d), []string{"a", "b"}) || !slices.Equal(d.Capabilities, []string{"a.cap", "z.cap"}) || d.Rule != "id:p" {
		t.Errorf("decision = %+v", d)
	}
}

func TestEffectClassOrder(t *testing.T) {
	order := []string{"read", "write", "money_move", "admin"}
	prev := EffectClass(0)
	for _, n := range order {
		c, err := ParseEffectClass(n)
		if err != nil {
			t.Fatal(err)
		}
		if c <= prev || c.String() != n {
			t.Fatalf("%s: class %d not above %d or String %q", n, c, prev, c.String())
		}
		prev = c
	}
	if _, err := ParseEffectClass("Read"); err == nil {
		t.Error("effect classes are case-sensitive names")
	}
	if EffectClass(0).String() != "unclassified" {
		t.Error("the zero class must read as unclassified")
	}
}

func TestLockfilePath(t *testing.T) {
	dir := t.TempDir()
	write := func(name, lockfile string) string {
		path := filepath.Join(dir, name)
		src := "tools: []\n"
		if lockfile != "" {
			src = "lockfile: " + lockfile + "\n" + src
		}
		if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	if got := mustLoad(t, write("rel.yaml", "capsnap.lock")).Lockfile(); got != filepath.Join(dir, "capsnap.lock") {
		t.Errorf("relative lockfile resolved to %q", got)
	}
	if got := mustLoad(t, write("abs.yaml", "/etc/capsnap/capsnap.lock")).Lockfile(); got != "/etc/capsnap/capsnap.lock" {
		t.Errorf("absolute lockfile became %q", got)
	}
	if got := mustLoad(t, write("none.yaml", "")).Lockfile(); got != "" {
		t.Errorf("no lockfile reads as %q", got)
	}
	if got := mustParse(t, "lockfile: capsnap.lock\ntools: []\n").Lockfile(); got != "capsnap.lock" {
		t.Errorf("Parse changed the lockfile path to %q", got)
	}
}

// The rules of each kind a decision applies, as the kinds compiled them;
// none for a denial's zero Decision.
func appliedOf[A Applied](d Decision, key string) A {
	var zero A
	if d.applied == nil {
		return zero
	}
	return d.applied[kindIndex(key)].(A)
}

func constraintsOf(d Decision) constraints { return appliedOf[constraints](d, "constraints") }
func budgetsOf(d Decision) budgets         { return appliedOf[budgets](d, "budgets") }
func rateLimitsOf(d Decision) rateLimits   { return appliedOf[rateLimits](d, "rate_limits") }
func approvalOf(d Decision) *ApprovalRule  { return appliedOf[approvalRules](d, "approval").a }
func afterOf(d Decision) []string          { return appliedOf[*sequenceRules](d, "after").after }
func precedesOf(d Decision) bool           { return appliedOf[*sequenceRules](d, "after").precedes }
