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

// Every reason has its row in docs/DENIALS.md's table of denials, and the
// row says what its Spec does: operators look a reason up there, and a
// reason added without one, or a row that says another status or next
// step, is a gap.
func TestEveryReasonInDocs(t *testing.T) {
	doc, err := os.ReadFile("../docs/DENIALS.md")
	if err != nil {
		t.Fatal(err)
	}
	// The table under "## Reasons", and no other: other tables have
	// rows that start with a name in backquotes too.
	_, table, ok := strings.Cut(string(doc), "\n## Reasons\n")
	if ok {
		_, table, ok = strings.Cut(table, "\n| reason |")
	}
	if !ok {
		t.Fatal(`docs/DENIALS.md has no table of denials under "## Reasons"`)
	}
	table, _, _ = strings.Cut(table, "\n\n")
	rows := map[string][]string{}
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) == 4 && strings.HasPrefix(cells[0], "| `") {
			rows[strings.Trim(cells[0], "| `")] = cells
		}
	}
	for _, r := range declared(t) {
		row, ok := rows[string(r)]
		if !ok {
			t.Errorf("docs/DENIALS.md's table of denials has no row for %s", r)
			continue
		}
		if status := strconv.Itoa(r.Spec().Status); !strings.HasPrefix(row[1], status) {
			t.Errorf("docs/DENIALS.md: %s's HTTP status is %q, its Spec's %s", r, row[1], status)
		}
		if returnTo := "`" + r.ReturnTo() + "`"; !strings.HasPrefix(row[3], returnTo) {
			t.Errorf("docs/DENIALS.md: %s's return_to is %q, its Spec's %s", r, row[3], returnTo)
		}
	}
}

// declared are the Reason constants deny.go declares.
func declared(t *testing.T) []Reason {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "deny.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []Reason
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
			out = append(out, Reason(reason))
		}
		return true
	})
	if len(out) < 20 {
		t.Fatalf("found %d reasons in deny.go; the test no longer reads them", len(out))
	}
	return out
}
