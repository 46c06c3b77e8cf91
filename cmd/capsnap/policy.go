package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/policy"
)

func policyCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"policy: lint, explain or reload is required"}
	}
	switch args[0] {
	case "lint":
		return policyLint(args[1:], stdout)
	case "explain":
		return policyExplain(args[1:], stdout, stderr)
	case "reload":
		return policyReload(args[1:], stdout, stderr)
	default:
		return usageError{fmt.Sprintf("policy: unknown subcommand %q", args[0])}
	}
}

// policyLint validates a policy file and prints its warnings; errors fail.
func policyLint(args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return usageError{"policy lint: exactly one FILE is required"}
	}
	p, err := policy.Load(args[0])
	if err != nil {
		return err
	}
	warnings := policy.Lint(p)
	for _, w := range warnings {
		fmt.Fprintf(stdout, "%s: warning: %s\n", args[0], w)
	}
	fmt.Fprintf(stdout, "%s: ok (policy %s, %d warnings)\n", args[0], p.Digest(), len(warnings))
	return nil
}

func policyExplain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("policy explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("policy", "", "policy file")
	principal := fs.String("principal", "", "principal (SPIFFE ID or JWT subject)")
	server := fs.String("server", "", "server_id")
	tool := fs.String("tool", "", "tool name")
	rawArgs := fs.String("args", "", "tool arguments as a JSON object (optional)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *file == "" || *principal == "" || *server == "" || *tool == "" || fs.NArg() != 0 {
		return usageError{"policy explain: --policy, --principal, --server and --tool are required"}
	}
	p, err := policy.Load(*file)
	if err != nil {
		return err
	}
	var callArgs map[string]any
	if *rawArgs != "" {
		if err := json.Unmarshal([]byte(*rawArgs), &callArgs); err != nil {
			return usageError{fmt.Sprintf("policy explain: --args is not a JSON object: %v", err)}
		}
	}
	for _, line := range p.Explain(*principal, *server, *tool, callArgs) {
		fmt.Fprintln(stdout, line)
	}
	return nil
}

// policyReload asks a running capsnap to reload its policy; only this
// command (with --allow-loosening) can put a looser policy in force. With
// --config it reads capsnap's own configuration for where to ask
// (admin_addr, on loopback if it listens on every interface) and the token
// to ask with (admin.token_file); --admin and --token-file override it.
func policyReload(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("policy reload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	admin := fs.String("admin", config.Default().AdminAddr, "capsnap's admin_addr")
	tokenFile := fs.String("token-file", "", "the file holding capsnap's admin token (admin.token_file)")
	configPath := fs.String("config", "", "capsnap's configuration file, for admin_addr and admin.token_file")
	loosen := fs.Bool("allow-loosening", false, "put the new policy in force even if it loosens the one in force")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usageError{"policy reload: no arguments besides flags"}
	}
	if *configPath != "" {
		cfg, err := config.Load(*configPath)
		if err != nil {
			return err
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["admin"] {
			*admin = loopbackIfUnspecified(cfg.AdminAddr)
		}
		if !set["token-file"] {
			*tokenFile = cfg.Admin.TokenFile
		}
	}
	req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://%s/policy/reload?allow_loosening=%t", *admin, *loosen), strings.NewReader("{}"))
	if err != nil {
		return usageError{fmt.Sprintf("policy reload: --admin %q: %v", *admin, err)}
	}
	req.Header.Set("Content-Type", "application/json")
	if *tokenFile != "" {
		tok, err := config.Admin{TokenFile: *tokenFile}.ReadToken()
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
