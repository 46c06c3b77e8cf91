package policy

import (
	"bufio"
	"os"
	"path/filepath"
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

func TestDecide(t *testing.T) {
	p, err := Load("testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const support, auditor = "spiffe://acme/agent/support-refund", "spiffe://acme/agent/auditor"
	tests := []struct {
		principal, server, tool string
		effect                  EffectClass
		reason                  deny.Reason
	}{
		{support, "billing", "refund", MoneyMove, ""},
		{support, "billing", "lookup_order", Read, ""},
		{auditor, "billing", "refund", MoneyMove, ""},
		{support, "files", "read_file", 0, deny.ToolNotGranted},
		{"spiffe://acme/agent/other", "billing", "refund", 0, deny.ToolNotGranted},
		{support, "billing", "delete_everything", 0, deny.UnclassifiedTool},
		{auditor, "billing", "new_tool", 0, deny.UnclassifiedTool},
		// Same tool name on another server is another tool.
		{support, "files", "refund", 0, deny.UnclassifiedTool},
	}
	for _, tt := range tests {
		d, err := p.Decide(tt.principal, tt.server, tt.tool)
		if tt.reason != "" {
			de, ok := deny.As(err)
			if !ok || de.Reason != tt.reason {
				t.Errorf("Decide(%s, %s, %s) = %v, want %s", tt.principal, tt.server, tt.tool, err, tt.reason)
			}
			continue
		}
		if err != nil || d.Effect != tt.effect || !strings.HasPrefix(d.Digest, "sha256:") {
			t.Errorf("Decide(%s, %s, %s) = %+v, %v; want effect %v", tt.principal, tt.server, tt.tool, d, err, tt.effect)
		}
	}
}

// Editing one tool's rule must change that tool's decision digest and leave
// every other tool's alone, or a reload would drift-deny unrelated snapshots.
func TestDecisionDigestIsPerRule(t *testing.T) {
	base := File{
		Tools:      []ToolRule{{"billing", "refund", "money_move"}, {"billing", "lookup_order", "read"}},
		Principals: []PrincipalRule{{ID: "a", Grants: []Grant{{Server: "billing", Tools: []string{"refund", "lookup_order"}}}}},
	}
	edited := base
	edited.Tools = []ToolRule{{"billing", "refund", "admin"}, {"billing", "lookup_order", "read"}}
	p1, err := Compile(base)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := Compile(edited)
	if err != nil {
		t.Fatal(err)
	}
	r1, _ := p1.Decide("a", "billing", "refund")
	r2, _ := p2.Decide("a", "billing", "refund")
	l1, _ := p1.Decide("a", "billing", "lookup_order")
	l2, _ := p2.Decide("a", "billing", "lookup_order")
	if r1.Digest == r2.Digest {
		t.Error("refund's digest did not change when its rule did")
	}
	if l1.Digest != l2.Digest {
		t.Error("lookup_order's digest changed when only refund's rule did")
	}
	if p1.Digest() == p2.Digest() {
		t.Error("whole-policy digest did not change")
	}
	// Rule order in the file is not part of the contract.
	reordered := base
	reordered.Tools = []ToolRule{base.Tools[1], base.Tools[0]}
	p3, err := Compile(reordered)
	if err != nil {
		t.Fatal(err)
	}
	if r3, _ := p3.Decide("a", "billing", "refund"); r3.Digest != r1.Digest {
		t.Error("reordering rules changed a decision digest")
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
}
