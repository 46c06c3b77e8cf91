// Command capsnap is the capability-snapshot authorizer for MCP tool calls,
// run as an Envoy ext_authz gRPC server.
//
//	capsnap serve --config FILE     run the server
//	capsnap check --config FILE [--envoy FILE]   validate the config and policy, then exit
//	capsnap digest FILE             print each tool's schema digest
//	capsnap policy lint|explain|reload   work with the policy
//	capsnap audit verify --jwks FILE AUDIT_FILE...   verify an audit trail
//	capsnap version                 print the version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  capsnap serve --config FILE   run the ext_authz server
  capsnap check --config FILE [--envoy FILE]
                                validate config and policy, then exit; with --envoy, warn
                                where that Envoy bootstrap would not send tools/list
                                responses back to capsnap (the response path)
  capsnap digest FILE           print "<name> sha256:<hex>" for each tool in a tools/list result
  capsnap lock --config FILE [--out PATH] [--check] [--timeout 30s]   write (or --check) the approvals lockfile
  capsnap policy lint FILE      check a policy file
  capsnap policy explain --policy FILE --principal P --server S --tool T [--args JSON]
                                print the decision and why
  capsnap policy reload [--config FILE] [--admin ADDR] [--token-file FILE] [--allow-loosening]
                                ask a running capsnap to reload its policy
  capsnap keys jwks --config FILE
                                print the JWKS of the envelope keys, for the MCP servers' verifiers
  capsnap audit verify --jwks FILE [--live] AUDIT_FILE...
                                verify an audit trail: its chain, signed checkpoints and end
                                (exit 0 verified, 1 not, 2 usage)
  capsnap version               print the version
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	var err error
	switch args[0] {
	case "serve":
		err = serveCmd(args[1:], stdout, stderr)
	case "check":
		err = checkCmd(args[1:], stdout, stderr)
	case "digest":
		err = digestCmd(args[1:], stdout, stderr)
	case "lock":
		err = lockCmd(args[1:], stdout, stderr)
	case "policy":
		err = policyCmd(args[1:], stdout, stderr)
	case "keys":
		err = keysCmd(args[1:], stdout, stderr)
	case "audit":
		err = auditCmd(args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "capsnap", versionString())
		return exitOK
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "capsnap: unknown command %q\n%s", args[0], usage)
		return exitUsage
	}
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue), errors.Is(err, flag.ErrHelp):
		fmt.Fprintln(stderr, "capsnap:", err)
		return exitUsage
	default:
		fmt.Fprintln(stderr, "capsnap:", err)
		return exitFailure
	}
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func configFlag(name string, args []string, stderr io.Writer) (string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "configuration file (YAML)")
	if err := fs.Parse(args); err != nil {
		return "", err
	}
	if *path == "" || fs.NArg() != 0 {
		return "", usageError{name + ": exactly --config FILE is required"}
	}
	return *path, nil
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
