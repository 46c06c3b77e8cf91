package policy

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// yamlBlock is a fenced YAML block of a doc.
var yamlBlock = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// Every policy the docs show, a YAML block that starts with tools: or
// principals:, is one capsnap loads: a doc's example that the binary
// refuses is worse than none.
func TestDocsPoliciesLoad(t *testing.T) {
	for _, doc := range []string{"../docs/POLICY.md", "../docs/APPROVALS.md", "../docs/GETTING-STARTED.md"} {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range yamlBlock.FindAllStringSubmatch(string(data), -1) {
			block := m[1]
			if !strings.HasPrefix(block, "tools:") && !strings.HasPrefix(block, "principals:") {
				continue
			}
			n++
			if _, err := Parse([]byte(block)); err != nil {
				t.Errorf("%s: a policy it shows does not load: %v\n%s", doc, err, block)
			}
		}
		if n == 0 {
			t.Errorf("%s: no policy found to load", doc)
		}
	}
}
