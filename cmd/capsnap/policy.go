package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/policy"
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
	byTool := map[[2]string]json.RawMessage{}
	for _, c := range catalogs {
		server, path, ok := strings.Cut(c, "=")
		if !ok || server == "" || path == "" {
			return nil, usageError{fmt.Sprintf("policy lint: --catalog %q is not SERVER=FILE", c)}
		}
		defs, err := (&catalog.FileSource{Path: path}).Load()
		if err != nil {
			return nil, fmt.Errorf("policy lint: --catalog %s: %w", c, err)
		}
		for _, def := range defs {
			var t struct {
				Name        string          `json:"name"`
				InputSchema json.RawMessage `json:"inputSchema"`
			}
			if err := json.Unmarshal(def, &t); err != nil {
				return nil, fmt.Errorf("policy lint: --catalog %s: %w", c, err)
			}
			byTool[[2]string{server, t.Name}] = t.InputSchema
		}
	}
	return func(server, tool string) (json.RawMessage, bool) {
		s, ok := byTool[[2]string{server, tool}]
		return s, ok && s != nil
	}, nil
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

// reloadOptions are policy reload's flags; admin and tokenFile are "" when
// not given.
type reloadOptions struct {
	admin, tokenFile, config string
	loosen                   bool
}

// policyReload asks a running capsnap to reload its policy; only this
// command (with --allow-loosening) can put a looser policy in force. With
// --config it reads capsnap's own configuration for where to ask
// (admin_addr, on loopback if it listens on every interface) and the token
// to ask with (admin.token_file); --admin and --token-file override it.
func policyReload(o reloadOptions, stdout io.Writer) error {
	if o.config != "" {
		cfg, err := config.Load(o.config)
		if err != nil {
			return err
		}
		if o.admin == "" {
			o.admin = loopbackIfUnspecified(cfg.AdminAddr)
		}
		if o.tokenFile == "" {
			o.tokenFile = cfg.Admin.TokenFile
		}
	}
	if o.admin == "" {
		o.admin = config.Default().AdminAddr
	}
	req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://%s/policy/reload?allow_loosening=%t", o.admin, o.loosen), strings.NewReader("{}"))
	if err != nil {
		return usageError{fmt.Sprintf("policy reload: --admin %q: %v", o.admin, err)}
	}
	req.Header.Set("Content-Type", "application/json")
	if o.tokenFile != "" {
		tok, err := config.Admin{TokenFile: o.tokenFile}.ReadToken()
		if err != nil {
			return fmt.Errorf("policy reload: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+string(tok))
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("policy reload: %w", err)
	}
	defer resp.Body.Close()
	var out struct{ Result, Error string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return fmt.Errorf("policy reload: %s: %w", resp.Status, err)
	}
	if out.Error != "" {
		return errors.New("policy reload " + out.Result + ": " + out.Error)
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
