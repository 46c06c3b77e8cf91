// Package policytest runs a policy's tests, capsnap policy test: each case
// a tools/call that the decision core (package decide) decides as serve
// would, from the state the case gives (what its budgets and rate limits
// already hold, the tools already called, a person's approval, the time),
// and that policy explain explains. A case passes when the core decides
// as the case expects and as explain said it would: the two disagreeing
// is a bug in capsnap, and fails the case whatever it expected.
//
// A test file is YAML, decoded strictly:
//
//	policy: policy.yaml              # relative to this file; --policy overrides
//	catalogs:                        # optional: a server's tools/list result
//	  billing: billing-tools.json    # (else each tool accepts any arguments)
//	cases:
//	  - name: a refund over the cap
//	    principal: spiffe://acme/agent/support-refund
//	    server: billing
//	    tool: refund
//	    arguments: {"order_id": "A-100", "amount": 300, "reason_code": "damaged"}
//	    at: 2026-12-07T10:00:00+02:00  # when the call is made (default: now)
//	    called: [lookup_order]       # allowed earlier under the same snapshot
//	    used: {daily_refunds: 400}   # what a budget or rate limit already holds
//	    approval: approved           # or denied, or pending
//	    decision: deny               # allow, deny or held
//	    reason: constraint_violation # a deny's reason
package policytest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/internal/yamlkeys"
)

// File is a test file.
type File struct {
	// Path is where it was read from, as its findings name it.
	Path string
	// Policy is the policy file it tests, resolved against Path's
	// directory; "" when it names none.
	Policy string
	// Catalogs are the files holding a server's tools/list result, by
	// server_id, resolved against Path's directory.
	Catalogs map[string]string
	Cases    []Case
}

// Case is one call and the decision it expects.
type Case struct {
	Name string
	// Line is where the case starts in its file.
	Line                    int
	Principal, Server, Tool string
	// Arguments are the call's arguments, a JSON object.
	Arguments json.RawMessage
	// At is when the call is made; zero is when the test runs.
	At time.Time
	// Called are the tools allowed earlier under the call's snapshot, for
	// its sequence rule (after).
	Called []string
	// Used is what the call's budgets and rate limits already hold, by
	// the rule's name or its field in the policy (tools[0].budgets[1]),
	// in the rule's units: a budget's amount, a rate limit's calls.
	Used map[string]float64
	// Approval is the state of a person's approval of this exact call:
	// "" (none asked), Approved, Denied or Pending.
	Approval string
	Want     Outcome
}

// The states of a case's approval.
const (
	Approved = "approved"
	Denied   = "denied"
	Pending  = "pending"
)

// Outcome is a decision on a call, as a case expects it.
type Outcome struct {
	// Decision is Allow, Deny or Held.
	Decision string
	// Reason is a Deny's.
	Reason deny.Reason
}

// The decisions on a call.
const (
	Allow = "allow"
	Deny  = "deny"
	// Held is a call denied approval_required: it waits for a person.
	Held = "held"
)

func (o Outcome) String() string {
	if o.Decision == Deny {
		return Deny + " " + string(o.Reason)
	}
	return o.Decision
}

// outcomeOf is the outcome of a call the core decided: allowed (nil), or
// denied for reason.
func outcomeOf(denial *deny.Error) Outcome {
	switch {
	case denial == nil:
		return Outcome{Decision: Allow}
	case denial.Reason == deny.ApprovalRequired:
		return Outcome{Decision: Held}
	}
	return Outcome{Decision: Deny, Reason: denial.Reason}
}

// reasons are the reasons a case may expect a call denied for: those of
// the policy's rules, and those of a server's tools/list when the test
// gives one (invalid_arguments, unknown_tool). approval_required is Held.
// Every other reason is about the snapshot or the catalog, which a case
// does not test.
var reasons = []deny.Reason{
	deny.ToolNotGranted, deny.UnclassifiedTool, deny.ConstraintViolation, deny.OutsideSchedule,
	deny.RateLimited, deny.BudgetExhausted, deny.SequenceViolation, deny.ApprovalDenied,
	deny.InvalidArguments, deny.UnknownTool,
}

// file and testCase are a test file as written.
type file struct {
	Policy   string            `yaml:"policy"`
	Catalogs map[string]string `yaml:"catalogs"`
	Cases    []testCase        `yaml:"cases"`
}

type testCase struct {
	Name      string             `yaml:"name"`
	Principal string             `yaml:"principal"`
	Server    string             `yaml:"server"`
	Tool      string             `yaml:"tool"`
	Arguments yaml.Node          `yaml:"arguments"`
	At        string             `yaml:"at"`
	Called    []string           `yaml:"called"`
	Used      map[string]float64 `yaml:"used"`
	Approval  string             `yaml:"approval"`
	Decision  string             `yaml:"decision"`
	Reason    string             `yaml:"reason"`
}

// Load reads a test file and checks every case. The policy and catalog
// files it names are taken relative to its directory.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load test file: %w", err)
	}
	f, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if f.Policy != "" && !filepath.IsAbs(f.Policy) {
		f.Policy = filepath.Join(dir, f.Policy)
	}
	for server, p := range f.Catalogs {
		if !filepath.IsAbs(p) {
			f.Catalogs[server] = filepath.Join(dir, p)
		}
	}
	return f, nil
}

// Parse decodes a test file strictly, an unknown key an error naming its
// line, and checks every case: its call named, its state and expectation
// ones a case can have. The file is a mapping (policy, catalogs, cases),
// or just the list of cases. Errors start with path and the line. Paths
// in it stay as written.
func Parse(path string, data []byte) (*File, error) {
	// Where each case and its keys are, for the findings.
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, located(path, err)
	}
	if len(doc.Content) == 0 {
		return nil, fmt.Errorf("%s: no cases", path)
	}
	root, cases := resolved(doc.Content[0]), resolved(doc.Content[0])
	var raw file
	into := any(&raw)
	switch root.Kind {
	case yaml.SequenceNode:
		into = &raw.Cases
	case yaml.MappingNode:
		cases = resolved(valueOf(root, "cases"))
	default:
		return nil, fmt.Errorf("%s:%d: want a mapping with the cases under cases:, or the list of cases", path, root.Line)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(into); err != nil {
		return nil, located(path, yamlkeys.Explain(err, reflect.TypeOf(into).Elem()))
	}
	if err := dec.Decode(new(any)); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: more than one YAML document", path)
	}
	for _, server := range slices.Sorted(maps.Keys(raw.Catalogs)) {
		if server == "" || raw.Catalogs[server] == "" {
			return nil, fmt.Errorf("%s:%d: catalogs: a server_id and its file are required", path, lineOf(valueOf(root, "catalogs"), root))
		}
	}
	if len(raw.Cases) == 0 {
		return nil, fmt.Errorf("%s:%d: cases: at least one case is required", path, lineOf(cases, root))
	}
	f := &File{Path: path, Policy: raw.Policy, Catalogs: map[string]string{}}
	maps.Copy(f.Catalogs, raw.Catalogs)
	names := map[string]int{}
	for i, rc := range raw.Cases {
		c, err := check(rc, resolved(cases.Content[i]))
		if err != nil {
			return nil, fmt.Errorf("%s:%d: cases[%d].%w", path, err.line, i, err.err)
		}
		c.Line = cases.Content[i].Line // an alias's, where it stands
		if prev, dup := names[c.Name]; dup {
			return nil, fmt.Errorf("%s:%d: cases[%d].name: %q is also the name of the case at line %d", path, c.Line, i, c.Name, prev)
		}
		names[c.Name] = c.Line
		f.Cases = append(f.Cases, c)
	}
	return f, nil
}

// yamlLine is the line yaml's errors start with.
var yamlLine = regexp.MustCompile(`^(?:yaml: )?(?:unmarshal errors:\n\s*)?line (\d+): `)

// located is yaml's "line 3: ..." as "path:3: ...", or else err after
// path.
func located(path string, err error) error {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("%s:%s: %s", path, m[1], msg[len(m[0]):])
	}
	return fmt.Errorf("%s: %w", path, err)
}

// fieldError is a finding in a case, on a line.
type fieldError struct {
	line int
	err  error
}

// check reads the case rc, written at n.
func check(rc testCase, n *yaml.Node) (Case, *fieldError) {
	// fail is a finding on key, at its line, or its case's when the
	// case has no key; failOn, at the line of another key.
	failOn := func(at, key, format string, args ...any) (Case, *fieldError) {
		return Case{}, &fieldError{lineOf(valueOf(n, at), n), fmt.Errorf("%s: "+format, append([]any{key}, args...)...)}
	}
	fail := func(key, format string, args ...any) (Case, *fieldError) { return failOn(key, key, format, args...) }
	c := Case{Name: rc.Name, Line: n.Line, Principal: rc.Principal, Server: rc.Server, Tool: rc.Tool,
		Called: rc.Called, Used: rc.Used, Approval: rc.Approval, Want: Outcome{Decision: rc.Decision, Reason: deny.Reason(rc.Reason)}}
	for _, f := range [][2]string{{"name", rc.Name}, {"principal", rc.Principal}, {"server", rc.Server}, {"tool", rc.Tool}} {
		if strings.TrimSpace(f[1]) == "" {
			return fail(f[0], "required")
		}
	}
	args, ferr := argumentsOf(&rc.Arguments)
	if ferr != nil {
		return Case{}, &fieldError{ferr.line, fmt.Errorf("arguments: %w", ferr.err)}
	}
	c.Arguments = args
	if rc.At != "" {
		var err error
		if c.At, err = time.Parse(time.RFC3339, rc.At); err != nil {
			return fail("at", "%q is not an RFC 3339 time (like 2026-12-07T10:00:00+02:00)", rc.At)
		}
	}
	for i, tool := range rc.Called {
		if tool == "" {
			return fail("called", "item %d is empty", i)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(rc.Used)) {
		switch used := rc.Used[name]; {
		case name == "":
			return fail("used", "a budget's or rate limit's name is required")
		case !(used >= 0):
			return fail("used", "%s: %v; what a budget or rate limit holds is at least 0", name, used)
		}
	}
	switch rc.Approval {
	case "", Approved, Denied, Pending:
	default:
		return fail("approval", "%q, want %s, %s or %s", rc.Approval, Approved, Denied, Pending)
	}
	switch rc.Decision {
	case Allow:
		if rc.Reason != "" {
			return fail("reason", "an allowed call has none")
		}
	case Held:
		if r := deny.Reason(rc.Reason); r != "" && r != deny.ApprovalRequired {
			return fail("reason", "a held call's is %s", deny.ApprovalRequired)
		}
		c.Want.Reason = ""
	case Deny:
		switch r := deny.Reason(rc.Reason); {
		case r == "":
			return failOn("decision", "reason", "required for decision %s: one of %s", Deny, reasonList())
		case r == deny.ApprovalRequired:
			return fail("reason", "a call waiting for a person's approval is decision %s", Held)
		case !slices.Contains(reasons, r):
			return fail("reason", "%q is not a reason a policy test decides: want one of %s", r, reasonList())
		}
	case "":
		return fail("decision", "required: %s, %s or %s", Allow, Deny, Held)
	default:
		return fail("decision", "%q, want %s, %s or %s", rc.Decision, Allow, Deny, Held)
	}
	return c, nil
}

func reasonList() string {
	s := make([]string, len(reasons))
	for i, r := range reasons {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}

// resolved is n, or the node the alias n stands for.
func resolved(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// valueOf is the value of key in the mapping n, nil if it has none.
func valueOf(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// lineOf is v's line, or else its parent's.
func lineOf(v, parent *yaml.Node) int {
	if v != nil {
		return v.Line
	}
	return parent.Line
}
