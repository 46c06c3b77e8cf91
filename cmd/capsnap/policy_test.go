package main

import (
	"bytes"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/policytest"
)

var updatePolicyTest = flag.Bool("update-policy-test", false, "rewrite testdata/policytest/*.golden from policy test's output")

// The demo's policy passes its own tests (examples/demo/policy_test.yaml),
// so that make test holds the worked example to what it says it does.
func TestDemoPolicyTests(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"policy", "test", "--verbose", "../../examples/demo/policy_test.yaml"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, &stdout, &stderr)
	}
	out := stdout.String()
	if !regexp.MustCompile(`(?m)^PASS: (\d+)/(\d+)\n$`).MatchString(out) || strings.Contains(out, "--- FAIL") {
		t.Fatalf("output:\n%s", out)
	}
	for _, want := range []string{"deny tool_not_granted", "deny constraint_violation", "deny sequence_violation", "deny unclassified_tool", ": allow"} {
		if !strings.Contains(out, want) {
			t.Errorf("no case decided %s:\n%s", want, out)
		}
	}
}

// policy test on each testdata file: its exit and what it says, the
// failing file's whole output held to its golden file.
func TestPolicyTest(t *testing.T) {
	const dir = "testdata/policytest/"
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string // regexp, or the golden file's name
		stderr string // substring
	}{
		{"passing", []string{dir + "catalog.yaml"}, exitOK, `^PASS: 1/1\n$`, ""},
		{"passing, verbose", []string{"-v", dir + "catalog.yaml"}, exitOK,
			`^--- PASS: testdata/policytest/catalog.yaml:7: a refund without its reason: deny invalid_arguments\nPASS: 1/1\n$`, ""},
		{"failing", []string{dir + "failing.yaml"}, exitFailure, "failing.golden", "policy test: FAIL"},
		{"failing, verbose", []string{"--verbose", dir + "failing.yaml"}, exitFailure,
			`(?s)^--- PASS: testdata/policytest/failing.yaml:5: a lookup: allow\n--- FAIL: .*--- PASS: testdata/policytest/failing.yaml:33: a refund before the lookup: deny sequence_violation\nFAIL: 3/5\n$`, ""},
		{"two files", []string{dir + "catalog.yaml", dir + "failing.yaml"}, exitFailure, `\nFAIL: 3/6\n$`, ""},
		{"--policy over the file's", []string{"--policy", "testdata/seed-policy.yaml", dir + "no-policy.yaml"}, exitOK, `^PASS: 1/1\n$`, ""},
		{"--catalog over the file's", []string{"--catalog", "billing=testdata/response.json", dir + "catalog.yaml"}, exitOK, `^PASS: 1/1\n$`, ""},
		{"no test file", nil, exitUsage, "^$", "policy test: at least one TESTFILE is required"},
		{"no policy", []string{dir + "no-policy.yaml"}, exitUsage, "^$", "no-policy.yaml names no policy: give --policy FILE"},
		{"an invalid test file", []string{dir + "catalog.yaml", dir + "invalid.yaml"}, exitUsage, "^$",
			"policy test: testdata/policytest/invalid.yaml:7: unknown key decison (did you mean decision?)"},
		{"an unreadable test file", []string{dir + "nope.yaml"}, exitUsage, "^$", "open testdata/policytest/nope.yaml"},
		{"an unreadable policy", []string{"--policy", "testdata/nope.yaml", dir + "catalog.yaml"}, exitFailure, "^$", "open testdata/nope.yaml"},
		{"an invalid policy", []string{"--policy", "testdata/broken-policy.yaml", dir + "catalog.yaml"}, exitFailure, "^$", `unknown effect class "superuser"`},
		{"an unreadable catalog", []string{"--catalog", "billing=testdata/nope.json", dir + "catalog.yaml"}, exitUsage, "^$", "open testdata/nope.json"},
		{"a bad --catalog", []string{"--catalog", "tools.json", dir + "catalog.yaml"}, exitUsage, "^$", `policy test: --catalog "tools.json" is not SERVER=FILE`},
		{"--catalog twice", []string{"--catalog", "billing=a.json", "--catalog", "billing=b.json", dir + "catalog.yaml"}, exitUsage, "^$", "--catalog billing is given twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"policy", "test"}, tt.args...), &stdout, &stderr)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, &stdout, &stderr)
			}
			if !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr %q does not contain %q", &stderr, tt.stderr)
			}
			if !strings.HasSuffix(tt.stdout, ".golden") {
				if !regexp.MustCompile(tt.stdout).MatchString(stdout.String()) {
					t.Errorf("stdout %q does not match %s", &stdout, tt.stdout)
				}
				return
			}
			golden := dir + tt.stdout
			if *updatePolicyTest {
				if err := os.WriteFile(golden, stdout.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if stdout.String() != string(want) {
				t.Errorf("stdout differs from %s (go test -run TestPolicyTest -update-policy-test):\n%s", golden, &stdout)
			}
		})
	}
}

// A case on which explain and the decision core disagree is reported as
// capsnap's bug, whatever the case expected.
func TestReportDisagreement(t *testing.T) {
	var out bytes.Buffer
	res := policytest.Result{
		Case: policytest.Case{Name: "a payout", Line: 3, Want: policytest.Outcome{Decision: policytest.Allow}},
		Got:  policytest.Outcome{Decision: policytest.Held}, Denial: &deny.Error{Reason: deny.ApprovalRequired, Detail: "waits"},
		Explain: []string{"allowed"}, Verdict: policy.Verdict{},
		Disagreement: "explain allows it; the decision core denied it approval_required",
	}
	report(&out, "t.yaml", res, false)
	const want = "--- FAIL: t.yaml:3: a payout: expected allow, got held\n" +
		"    explain and the decision core disagree, a bug in capsnap: explain allows it; the decision core denied it approval_required\n" +
		"    denied approval_required: waits\n" +
		"    explain: allowed\n"
	if out.String() != want {
		t.Errorf("report:\n%s\nwant:\n%s", &out, want)
	}
	res.Case.Want = res.Got
	out.Reset()
	report(&out, "t.yaml", res, false)
	if !strings.HasPrefix(out.String(), "--- FAIL: t.yaml:3: a payout: explain and the decision core disagree, a bug in capsnap: ") {
		t.Errorf("a disagreement on a case that got what it expected:\n%s", &out)
	}
}
