package deny

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// Every reason has its row in the README's table of denials: operators
// look a reason up there, and a reason added without one is a gap.
func TestEveryReasonInREADME(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// The table under "### Denials", and no other: other tables have
	// rows that start with a name in backquotes too.
	_, table, ok := strings.Cut(string(readme), "\n### Denials\n")
	if ok {
		_, table, ok = strings.Cut(table, "\n| reason |")
	}
	if !ok {
		t.Fatal(`README.md has no table of denials under "### Denials"`)
	}
	table, _, _ = strings.Cut(table, "\n\n")
	f, err := parser.ParseFile(token.NewFileSet(), "deny.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	ast.Inspect(f, func(node ast.Node) bool {
		spec, ok := node.(*ast.ValueSpec)
		if !ok {
			return true
		}
		if id, ok := spec.Type.(*ast.Ident); !ok || id.Name != "Reason" {
			return true
		}
		for _, v := range spec.Values {
			lit, ok := v.(*ast.BasicLit)
			if !ok {
				continue
			}
			reason, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			n++
			if !strings.Contains(table, "\n| `"+reason+"` |") {
				t.Errorf("README.md's table of denials has no row for %s", reason)
			}
		}
		return true
	})
	if n < 20 {
		t.Fatalf("found %d reasons in deny.go; the test no longer reads them", n)
	}
}
