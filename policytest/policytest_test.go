package policytest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/policy"
)

// Every file of testdata/invalid is refused with the finding its first
// line wants ("# want: FILE:LINE: ..."), where it is.
func TestLoadInvalid(t *testing.T) {
	files, err := filepath.Glob("testdata/invalid/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no files in testdata/invalid (%v)", err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			first, _, _ := strings.Cut(string(data), "\n")
			want, ok := strings.CutPrefix(first, "# want: ")
			if !ok {
				t.Fatalf("%s does not start with # want: FILE:LINE: the error", path)
			}
			want = strings.Replace(want, "FILE", path, 1)
			if _, err := Load(path); err == nil || err.Error() != want {
				t.Fatalf("Load: %v\nwant: %s", err, want)
			}
		})
	}
}

// A test file's cases are read as written, its paths against its own
// directory; a file may be just the list of its cases.
func TestLoad(t *testing.T) {
	f, err := Load("testdata/kinds.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if f.Policy != filepath.Join("testdata", "policy.yaml") {
		t.Errorf("policy %q, want it beside the test file", f.Policy)
	}
	i := slices.IndexFunc(f.Cases, func(c Case) bool { return c.Name == "a wire past its budget" })
	if i < 0 {
		t.Fatal("no case named a wire past its budget")
	}
	c := f.Cases[i]
	want := Case{Name: "a wire past its budget", Line: 71, Principal: "spiffe://acme/agent/support", Server: "billing", Tool: "wire",
		Arguments: []byte(`{"amount":100,"iban":"EE38"}`), At: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC),
		Called: []string{"lookup_order"}, Used: map[string]float64{"daily_wires": 950},
		Want: Outcome{Decision: Deny, Reason: deny.BudgetExhausted}}
	if c.Line != want.Line || c.Principal != want.Principal || c.Server != want.Server || c.Tool != want.Tool ||
		string(c.Arguments) != string(want.Arguments) || !c.At.Equal(want.At) || !slices.Equal(c.Called, want.Called) ||
		c.Used["daily_wires"] != 950 || len(c.Used) != 1 || c.Approval != "" || c.Want != want.Want {
		t.Errorf("case %+v\nwant %+v", c, want)
	}

	list, err := Parse("list.yaml", []byte(`- {name: a, principal: p, server: s, tool: t, arguments: {"n": 1.50, "big": 12345678901234567890, "x": null, "ok": true, "l": [1, "two"], "when": 2026-01-01}, decision: held}`))
	if err != nil {
		t.Fatal(err)
	}
	if c := list.Cases[0]; list.Policy != "" || c.Want != (Outcome{Decision: Held}) ||
		string(c.Arguments) != `{"big":12345678901234567890,"l":[1,"two"],"n":1.50,"ok":true,"when":"2026-01-01","x":null}` {
		t.Errorf("a list of cases: %+v, arguments %s", list, c.Arguments)
	}
}

// The test file docs/POLICY.md shows under "Testing a policy" loads, and
// passes, against the policy it was written for (the demo's, as make demo
// ends with it) and billing's tools.
func TestPolicyDocExample(t *testing.T) {
	doc, err := os.ReadFile("../docs/POLICY.md")
	if err != nil {
		t.Fatal(err)
	}
	const start = "# policy_test.yaml: capsnap policy test policy_test.yaml\n"
	_, example, ok := strings.Cut(string(doc), start)
	if !ok {
		t.Fatalf("docs/POLICY.md has no example starting %q", start)
	}
	example, _, _ = strings.Cut(example, "```")
	dir := t.TempDir()
	for name, from := range map[string]string{"policy.yaml": "testdata/docs-policy.yaml", "billing-tools.json": "../cmd/capsnap/testdata/tools.json"} {
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "policy_test.yaml")
	if err := os.WriteFile(path, []byte(start+example), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load(f.Policy)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string][]json.RawMessage{}
	for server, file := range f.Catalogs {
		if tools[server], err = (&catalog.FileSource{Path: file}).Load(); err != nil {
			t.Fatal(err)
		}
	}
	r := &Runner{Policy: p, Tools: tools}
	for _, c := range f.Cases {
		if res := r.Run(c); !res.Passed() {
			t.Errorf("%s: want %s, got %s (%v); disagreement %q, error %v", c.Name, c.Want, res.Got, res.Denial, res.Disagreement, res.Err)
		}
	}
}
