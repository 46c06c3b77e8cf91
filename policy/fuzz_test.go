package policy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzParse holds Parse to never panicking, and every policy it accepts to
// the invariants the rest of capsnap relies on. The committed corpus is in
// testdata/fuzz/FuzzParse; every policy under testdata seeds it too.
func FuzzParse(f *testing.F) {
	for _, pattern := range []string{"testdata/*.yaml", "testdata/invalid/*.yaml"} {
		files, err := filepath.Glob(pattern)
		if err != nil {
			f.Fatal(err)
		}
		for _, name := range files {
			data, err := os.ReadFile(name)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			if p != nil {
				t.Fatal("Parse returned a policy and an error")
			}
			return
		}
		if !strings.HasPrefix(p.Digest(), "sha256:") {
			t.Fatalf("digest %q", p.Digest())
		}
		if loose := Loosenings(p, p); len(loose) > 0 {
			t.Fatalf("a policy is looser than itself: %q", loose)
		}
		Lint(p)
		LintArguments(p, func(string, string) (json.RawMessage, bool) {
			return json.RawMessage(`{"properties": {"amount": {}}}`), true
		})
		var principals []string
		for id := range p.exact {
			principals = append(principals, id)
		}
		for prefix := range p.prefixes {
			principals = append(principals, prefix+"x")
		}
		for k := range p.tools {
			for _, who := range principals {
				d, err := p.Decide(who, k.server, k.tool)
				allowed := false
				for _, name := range p.Allowed(who, k.server) {
					allowed = allowed || name == k.tool
				}
				if (err == nil) != allowed {
					t.Fatalf("Decide(%q, %s) = %v, but Allowed says %v", who, k, err, allowed)
				}
				if err == nil && !strings.HasPrefix(d.Digest, "sha256:") {
					t.Fatalf("Decide(%q, %s) digest %q", who, k, d.Digest)
				}
				in := Input{Args: map[string]any{"amount": 1.0}, Principal: who, Server: k.server, Tool: k.tool}
				for _, c := range constraintsOf(d) {
					// Must fail closed or hold, never panic.
					_ = c.CheckInput(in)
				}
				for _, b := range budgetsOf(d) {
					_ = b.CheckInput(in)
				}
				p.Explain(who, k.server, k.tool, map[string]any{}, time.Time{})
			}
		}
	})
}
