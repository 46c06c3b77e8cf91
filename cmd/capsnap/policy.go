package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/policytest"
)

// policyLint validates a policy file and prints its warnings; errors fail.
func policyLint(file string, catalogs []string, stdout, stderr io.Writer) error {
	p, err := policy.Load(file)
	if err != nil {
		return err
	}
	schemas, err := catalogSchemas(catalogs)
	if err != nil {
		return err
	}
	warnings := policy.Lint(p)
	for _, w := range warnings {
		fmt.Fprintf(stdout, "%s: warning: %s\n", file, w)
	}
	errs := policy.LintArguments(p, schemas)
	for _, e := range errs {
		fmt.Fprintf(stderr, "%s: error: %s\n", file, e)
	}
	if len(errs) > 0 {
		return fmt.Errorf("policy lint: %s: %s", file, countOf(len(errs), "error"))
	}
	fmt.Fprintf(stdout, "%s: ok (policy %s, %d warnings)\n", file, p.Digest(), len(warnings))
	return nil
}

// catalogSchemas reads each SERVER=FILE, a tools/list result as a catalog
// file holds it, into the input schemas of the server's tools.
func catalogSchemas(catalogs []string) (policy.InputSchemas, error) {
	files, err := catalogArgs("policy lint", catalogs)
	if err != nil {
		return nil, err
	}
	tools, err := catalogFiles(files)
	if err != nil {
		return nil, fmt.Errorf("policy lint: --catalog %w", err)
	}
	byTool := map[[2]string]json.RawMessage{}
	for server, defs := range tools {
		for _, def := range defs {
			var t struct {
				Name        string          `json:"name"`
				InputSchema json.RawMessage `json:"inputSchema"`
			}
			if err := json.Unmarshal(def, &t); err != nil {
				return nil, fmt.Errorf("policy lint: --catalog %s=%s: %w", server, files[server], err)
			}
			byTool[[2]string{server, t.Name}] = t.InputSchema
		}
	}
	return func(server, tool string) (json.RawMessage, bool) {
		s, ok := byTool[[2]string{server, tool}]
		return s, ok && s != nil
	}, nil
}

// catalogArgs are command cmd's --catalog SERVER=FILE flags, by server.
func catalogArgs(cmd string, catalogs []string) (map[string]string, error) {
	files := map[string]string{}
	for _, c := range catalogs {
		server, path, ok := strings.Cut(c, "=")
		if !ok || server == "" || path == "" {
			return nil, usageError{fmt.Sprintf("%s: --catalog %q is not SERVER=FILE", cmd, c)}
		}
		if _, dup := files[server]; dup {
			return nil, usageError{fmt.Sprintf("%s: --catalog %s is given twice; a server has one tools/list", cmd, server)}
		}
		files[server] = path
	}
	return files, nil
}

// catalogFiles reads each server's file, a tools/list result as a catalog
// file holds it, into the server's tool definitions.
func catalogFiles(files map[string]string) (map[string][]json.RawMessage, error) {
	tools := map[string][]json.RawMessage{}
	for server, path := range files {
		defs, err := (&catalog.FileSource{Path: path}).Load()
		if err != nil {
			return nil, fmt.Errorf("%s=%s: %w", server, path, err)
		}
		tools[server] = defs
	}
	return tools, nil
}

// explainOptions are policy explain's flags.
type explainOptions struct {
	file, principal, server, tool string
	args                          string // JSON object, or "" for none
	at                            string // RFC 3339, or "" for now
}

// policyExplain prints the policy's decision on a call and why, and fails
// with errDenied when it is a denial.
func policyExplain(o explainOptions, stdout io.Writer) error {
	if o.principal == "" || o.server == "" || o.tool == "" {
		return usageError{"policy explain: --principal, --server and --tool are required"}
	}
	p, err := policy.Load(o.file)
	if err != nil {
		return err
	}
	var callArgs map[string]any
	if o.args != "" {
		if err := json.Unmarshal([]byte(o.args), &callArgs); err != nil {
			return usageError{fmt.Sprintf("policy explain: --args is not a JSON object: %v", err)}
		}
	}
	at := time.Now()
	if o.at != "" {
		if at, err = time.Parse(time.RFC3339, o.at); err != nil {
			return usageError{fmt.Sprintf("policy explain: --at is not an RFC 3339 time (like 2026-12-07T10:00:00+02:00): %v", err)}
		}
	}
	for _, line := range p.Explain(o.principal, o.server, o.tool, callArgs, at) {
		fmt.Fprintln(stdout, line)
	}
	return explainedDenial(p, o.principal, o.server, o.tool, callArgs, at)
}

// errDenied is policy explain's answer when the call is denied, once it
// has said why.
var errDenied = errors.New("policy explain: DENIED")

// explainedDenial is errDenied, with the reason, if the policy denies the
// call Explain explained: the decision taken as serve takes it, not read
// back from the explanation's words. Without args the constraints are not
// evaluated, and a call granted on them is not a denial.
func explainedDenial(p *policy.Policy, principal, server, tool string, args map[string]any, at time.Time) error {
	d, err := p.Decide(principal, server, tool)
	if err != nil {
		return fmt.Errorf("%w (%w)", errDenied, err)
	}
	// What the call's terms say of it without the store: whether a budget
	// has room depends on the calls before it, which explain does not
	// know.
	call := policy.Call{Input: policy.Input{Args: args, Principal: principal, Server: server, Tool: tool}, Now: at}
	if err := d.Precheck(call); err != nil {
		return fmt.Errorf("%w (%w)", errDenied, err)
	}
	return nil
}

func newPolicyTestCmd() *cobra.Command {
	var o testOptions
	c := &cobra.Command{
		Use:                   "test [--policy FILE] [--catalog SERVER=TOOLS_JSON]... [--verbose] TESTFILE...",
		DisableFlagsInUseLine: true,
		Short:                 "Run a policy's tests: each case a call the decision core decides",
		Long: `Run each case of each test file (docs/POLICY.md, "Testing a policy"): a
tools/call decided by capsnap's decision core as serve decides it, from the
state the case gives (what its budgets and rate limits hold, the tools
called before it, a person's approval, the time), and held to the decision
the case expects and to what policy explain says of it. The policy is the
one the test file names, or --policy. Every failing case is printed with
its file:line and what was decided; --verbose prints every case. Exit 0:
every case passed; 1: a case failed (or the policy does not load); 2: usage,
or a test file that cannot be read or is invalid.`,
		Example: "  capsnap policy test examples/demo/policy_test.yaml\n" +
			"  capsnap policy test --policy policy.yaml --catalog billing=billing-tools.json --verbose tests/*.yaml",
		RunE: func(c *cobra.Command, args []string) error {
			o.files = args
			return policyTest(o, c.OutOrStdout())
		},
	}
	c.Flags().StringVar(&o.policy, "policy", "", "policy file (default: the one each test file names)")
	c.Flags().StringArrayVar(&o.catalogs, "catalog", nil, "SERVER=FILE: the server's tools/list result, over the test file's (repeatable)")
	c.Flags().BoolVarP(&o.verbose, "verbose", "v", false, "print every case, not only those that fail")
	return c
}

// testOptions are policy test's flags and arguments.
type testOptions struct {
	policy   string   // "" for each test file's own
	catalogs []string // SERVER=FILE
	verbose  bool
	files    []string
}

// errTestFailed is policy test's answer when a case failed, once it has
// said which.
var errTestFailed = errors.New("policy test: FAIL")

// policyTest runs every case of each test file under its policy (or
// --policy) and reports, as go test does, each case that failed (every
// case with --verbose), then how many passed. A test file, or a catalog
// file it names, that cannot be read or is invalid is a usage error, found
// before any case runs: the test is broken, not the policy.
func policyTest(o testOptions, stdout io.Writer) error {
	if len(o.files) == 0 {
		return usageError{"policy test: at least one TESTFILE is required"}
	}
	flags, err := catalogArgs("policy test", o.catalogs)
	if err != nil {
		return err
	}
	type suite struct {
		file   *policytest.File
		policy string
		tools  map[string][]json.RawMessage
	}
	var suites []suite
	for _, path := range o.files {
		f, err := policytest.Load(path)
		if err != nil {
			return usageError{"policy test: " + err.Error()}
		}
		s := suite{file: f, policy: cmp.Or(o.policy, f.Policy)}
		if s.policy == "" {
			return usageError{fmt.Sprintf("policy test: %s names no policy: give --policy FILE", path)}
		}
		maps.Copy(f.Catalogs, flags)
		if s.tools, err = catalogFiles(f.Catalogs); err != nil {
			return usageError{fmt.Sprintf("policy test: %s: catalogs: %v", path, err)}
		}
		suites = append(suites, s)
	}
	now := time.Now()
	runners := make([]*policytest.Runner, len(suites))
	for i, s := range suites {
		p, err := policy.Load(s.policy)
		if err != nil {
			return fmt.Errorf("policy test: %w", err)
		}
		runners[i] = &policytest.Runner{Policy: p, Tools: s.tools, Now: now}
	}
	failed, total := 0, 0
	for i, s := range suites {
		for _, c := range s.file.Cases {
			res := runners[i].Run(c)
			total++
			if !res.Passed() {
				failed++
			}
			report(stdout, s.file.Path, res, o.verbose)
		}
	}
	if failed > 0 {
		fmt.Fprintf(stdout, "FAIL: %d/%d\n", failed, total)
		return errTestFailed
	}
	fmt.Fprintf(stdout, "PASS: %d/%d\n", total, total)
	return nil
}

// report says how res, a case of the test file at path, was decided: a
// failure as the case's place and name, what went wrong, the decision
// core's denial and what explain said; with verbose a pass in one line.
func report(w io.Writer, path string, res policytest.Result, verbose bool) {
	c := res.Case
	if res.Passed() {
		if verbose {
			fmt.Fprintf(w, "--- PASS: %s:%d: %s: %s\n", path, c.Line, c.Name, res.Got)
		}
		return
	}
	var problems []string
	if res.Err != nil {
		problems = append(problems, res.Err.Error())
	} else if res.Got != c.Want {
		problems = append(problems, fmt.Sprintf("expected %s, got %s", c.Want, res.Got))
	}
	if res.Disagreement != "" {
		problems = append(problems, "explain and the decision core disagree, a bug in capsnap: "+res.Disagreement)
	}
	fmt.Fprintf(w, "--- FAIL: %s:%d: %s: %s\n", path, c.Line, c.Name, problems[0])
	for _, p := range problems[1:] {
		fmt.Fprintf(w, "    %s\n", p)
	}
	if res.Denial != nil {
		fmt.Fprintf(w, "    denied %s: %s\n", res.Denial.Reason, res.Denial.Detail)
	}
	for _, line := range res.Explain {
		fmt.Fprintf(w, "    explain: %s\n", line)
	}
}

// reloadOptions are policy reload's flags: where to ask, and whether a
// person accepts a looser policy, who and why.
type reloadOptions struct {
	adminOptions
	loosen     bool
	by, reason string
}

// policyReload asks a running capsnap to reload its policy; only this
// command (with --allow-loosening, --by and --reason) can put a looser
// policy in force, and every replica that shares its store then puts the
// same files in force too.
func policyReload(o reloadOptions, stdout io.Writer) error {
	q := url.Values{}
	switch {
	case o.loosen && (o.by == "" || o.reason == ""):
		return usageError{"policy reload: --allow-loosening needs --by and --reason: who accepts the looser policy, and why, for the audit trail"}
	case o.loosen:
		q.Set("allow_loosening", "true")
		q.Set("by", o.by)
		q.Set("reason", o.reason)
	case o.by != "" || o.reason != "":
		return usageError{"policy reload: --by and --reason go with --allow-loosening"}
	}
	var out struct{ Result string }
	if err := o.ask("policy reload", http.MethodPost, "/policy/reload", q, &out); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "policy reload:", out.Result)
	return nil
}

// loopbackIfUnspecified is where to dial a listener on addr from its own
// host: its loopback address if it listens on every interface.
func loopbackIfUnspecified(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch ip := net.ParseIP(host); {
	case host == "":
		return net.JoinHostPort("127.0.0.1", port)
	case ip != nil && ip.IsUnspecified() && ip.To4() == nil:
		return net.JoinHostPort("::1", port)
	case ip != nil && ip.IsUnspecified():
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}
