package approval

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Every refusal has its row in docs/APPROVALS.md's table under
// "### Refusals", with its status, and the table has no other row.
func TestEveryRefusalInDocs(t *testing.T) {
	doc, err := os.ReadFile("../docs/APPROVALS.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "### Refusals\n")
	if !ok {
		t.Fatal(`docs/APPROVALS.md has no "### Refusals"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| (\\d{3}) \\|").FindAllStringSubmatch(section, -1) {
		rows[m[1]] = m[2]
	}
	for _, r := range apiErrors {
		if got, ok := rows[r.code]; !ok {
			t.Errorf("docs/APPROVALS.md has no row for %s", r.code)
		} else if got != strconv.Itoa(r.status) {
			t.Errorf("docs/APPROVALS.md: %s's status is %s, the code's %d", r.code, got, r.status)
		}
		delete(rows, r.code)
	}
	for code := range rows {
		t.Errorf("docs/APPROVALS.md has a row for %s, which the code has not", code)
	}
}
