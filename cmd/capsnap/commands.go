package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/capsnap/capsnap/audit"
)

// The command line, on github.com/spf13/cobra. Each command only reads its
// flags and arguments and calls the function that does its work, beside
// the rest of that work (serve.go, lock.go, policy.go, ...).

const rootLong = `capsnap authorizes MCP tool calls as an Envoy ext_authz and ext_proc gRPC
server (capsnap serve), against the tools each MCP server listed and the
policy; its other commands check a configuration, approve the live tools,
explain and test the policy and verify the audit trail.

Exit codes:
  0  ok: the command did its work and the answer is yes
  1  a negative answer, or a failure: check found the configuration invalid,
     policy explain denied the call, policy test found a case failing, audit
     verify did not verify the trail, lock --check found the lockfile out of
     date, or a command could not do its work (a file that cannot be read or
     does not load, whichever command names it; a server that does not
     answer)
  2  usage: an unknown command or flag, a missing or extra argument; for
     policy test also a test file that cannot be read or is invalid (the
     test is broken, not the policy)`

// newRootCmd is the capsnap command with every subcommand, writing to
// stdout and stderr. ran is set once a command has passed cobra's checks
// of its command line and runs.
func newRootCmd(stdout, stderr io.Writer) (root *cobra.Command, ran *bool) {
	ran = new(bool)
	root = &cobra.Command{
		Use:     "capsnap",
		Short:   "The capability-snapshot authorizer for MCP tool calls",
		Long:    rootLong,
		Version: versionString(),
		Example: `  capsnap serve --config capsnap.yaml
  capsnap check --config capsnap.yaml --envoy envoy.yaml
  capsnap policy explain --policy policy.yaml --principal spiffe://acme/agent/support --server billing --tool refund
  capsnap help policy explain`,
		// No Args: cobra's own check for an unknown command then comes
		// before it parses any flag, so that `capsnap serv --config x` is
		// an unknown command "serv" (did you mean serve?), not an unknown
		// flag --config.
		RunE: func(c *cobra.Command, _ []string) error {
			fmt.Fprint(c.ErrOrStderr(), c.UsageString())
			return usageError{"a command is required"}
		},
		PersistentPreRun: func(*cobra.Command, []string) { *ran = true },
		SilenceErrors:    true,
		SilenceUsage:     true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("capsnap {{.Version}}\n")
	root.AddCommand(
		newServeCmd(), newCheckCmd(), newDigestCmd(), newLockCmd(),
		newPolicyCmd(), newKeysCmd(), newAuditCmd(), newApprovalsCmd(), newBudgetsCmd(), newVersionCmd(),
	)
	// cobra adds help and completion itself when it executes; added now,
	// they get examples too, and help an exit code for an unknown topic.
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "help":
			c.Example = "  capsnap help\n  capsnap help policy explain"
			show := c.Run
			c.Run = nil
			c.RunE = func(c *cobra.Command, args []string) error {
				if _, rest, err := c.Root().Find(args); err != nil || len(rest) > 0 {
					return usageError{fmt.Sprintf("help: unknown command %q", strings.Join(args, " "))}
				}
				show(c, args)
				return nil
			}
		case "completion":
			c.Example = "  source <(capsnap completion bash)\n  capsnap completion zsh > \"${fpath[1]}/_capsnap\""
			for _, sh := range c.Commands() {
				sh.Example = fmt.Sprintf("  capsnap completion %s > capsnap.%s", sh.Name(), sh.Name())
			}
			group(c)
		}
	}
	return root, ran
}

// suggest is cobra's "did you mean" for a mistyped subcommand of c.
func suggest(c *cobra.Command, typed string) string {
	if c.SuggestionsMinimumDistance <= 0 {
		c.SuggestionsMinimumDistance = 2 // cobra's default
	}
	if s := c.SuggestionsFor(typed); len(s) > 0 {
		return "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return ""
}

// cmdName is c's command path without "capsnap ", for error messages.
func cmdName(c *cobra.Command) string {
	return strings.TrimPrefix(c.CommandPath(), c.Root().Name()+" ")
}

// noArgs is cobra.NoArgs as a usage error.
func noArgs(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Sprintf("%s: unexpected argument %q; it takes only flags", cmdName(c), args[0])}
	}
	return nil
}

// oneFile is the arguments of a command that reads one FILE.
func oneFile(c *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usageError{cmdName(c) + ": exactly one FILE is required"}
	}
	return nil
}

// group makes c a command that only holds subcommands: run bare, or with
// one it does not have, it is a usage error saying which it has. Its own
// flags are only --help: the others are a subcommand's, so that a
// misspelt one, with its flags, is reported as a misspelt subcommand.
func group(c *cobra.Command, subs ...*cobra.Command) *cobra.Command {
	c.AddCommand(subs...)
	c.FParseErrWhitelist.UnknownFlags = true
	var names []string
	for _, s := range c.Commands() {
		names = append(names, s.Name())
	}
	required := names[len(names)-1]
	if len(names) > 1 {
		required = strings.Join(names[:len(names)-1], ", ") + " or " + required
	}
	c.Args = func(c *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usageError{fmt.Sprintf("%s: unknown subcommand %q%s", cmdName(c), args[0], suggest(c, args[0]))}
		}
		return nil
	}
	c.RunE = func(c *cobra.Command, _ []string) error {
		return usageError{fmt.Sprintf("%s: the subcommand %s is required", cmdName(c), required)}
	}
	return c
}

func newServeCmd() *cobra.Command {
	var path string
	c := &cobra.Command{
		Use:                   "serve --config FILE",
		DisableFlagsInUseLine: true,
		Short:                 "Run the ext_authz and ext_proc gRPC server",
		Long: `Run the ext_authz and ext_proc gRPC server and the admin listener, until
SIGINT or SIGTERM; SIGHUP reloads the policy, never loosening it unless a
person accepted exactly those files (capsnap policy reload).`,
		Example: "  capsnap serve --config /etc/capsnap/capsnap.yaml",
		Args:    noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if path == "" {
				return usageError{"serve: exactly --config FILE is required"}
			}
			return serve(path, c.OutOrStdout(), c.ErrOrStderr())
		},
	}
	c.Flags().StringVar(&path, "config", "", "configuration file (YAML)")
	return c
}

func newCheckCmd() *cobra.Command {
	var (
		path, envoyPath string
		connect         bool
		timeout         time.Duration
	)
	c := &cobra.Command{
		Use:                   "check --config FILE [--envoy FILE] [--connect [--timeout 30s]]",
		DisableFlagsInUseLine: true,
		Short:                 "Validate the configuration, policy and catalog files, then exit",
		Long: `Validate the configuration, the policy and any catalog files without serving,
with serve's own loader: check refuses exactly what serve refuses to start
on (exit 1), and exits 0 when all is valid. The policy is held to the
configuration (a rule on a server id it does not configure is an error) and
to the tools of the catalog files: a constraint or budget that reads an
argument a tool's inputSchema does not declare, or a classified tool the
server does not list, is an error. With --connect every server is listed
live, as serve would list it, and held to the same (a live tool the policy
does not classify is an error too); the Redis store is reached and a JWKS
URL fetched. With --envoy, the Envoy bootstrap is held to the
configuration: each route's server id, the principal Envoy passes, the
cluster that reaches capsnap, the body limit, failing closed, no MCP route
unchecked, and the response path. Each finding names the field: an error
(the setup cannot work) exits 1, a warning (what xDS or a Service may make
right) does not.`,
		Example: "  capsnap check --config capsnap.yaml\n  capsnap check --config capsnap.yaml --connect\n  capsnap check --config capsnap.yaml --envoy envoy.yaml",
		Args:    noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if path == "" {
				return usageError{"check: exactly --config FILE is required; --envoy FILE and --connect are optional"}
			}
			if timeout <= 0 {
				return usageError{fmt.Sprintf("check: --timeout %s is not positive", timeout)}
			}
			return check(path, envoyPath, connect, timeout, c.OutOrStdout(), c.ErrOrStderr())
		},
	}
	c.Flags().StringVar(&path, "config", "", "configuration file (YAML)")
	c.Flags().StringVar(&envoyPath, "envoy", "", "an Envoy bootstrap (YAML) in front of this capsnap, to hold to this configuration")
	c.Flags().BoolVar(&connect, "connect", false, "list every server live and hold the policy to its tools")
	c.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "with --connect, how long every server has to list its tools")
	return c
}

func newDigestCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "digest FILE",
		Short: `Print "<name> sha256:<hex>" for each tool of a tools/list result`,
		Long: `Print "<name> sha256:<hex>", the schema digest, for each tool of a tools/list
result or of a whole JSON-RPC response carrying one.`,
		Example: "  capsnap digest tools.json",
		Args:    oneFile,
		RunE: func(c *cobra.Command, args []string) error {
			return digest(args[0], c.OutOrStdout())
		},
	}
}

func newLockCmd() *cobra.Command {
	var o lockOptions
	c := &cobra.Command{
		Use:                   "lock --config FILE [--out PATH] [--check] [--approved [--admin ADDR]] [--timeout 30s]",
		DisableFlagsInUseLine: true,
		Short:                 "Write, or check, the approvals lockfile from the live servers",
		Long: `Write the approvals lockfile from the tools the live servers list, as capsnap
itself sees them; with --check, compare them with the lockfile instead and
exit 1, printing the differences, when they differ. With --approved, the
tools are the definitions change control approved, as the running capsnap
at --admin (default: the config's admin_addr) holds them: the lockfile as
the GitOps form of what reviewers and the policy approved.`,
		Example: "  capsnap lock --config capsnap.yaml\n  capsnap lock --config capsnap.yaml --check\n  capsnap lock --config capsnap.yaml --approved",
		Args:    noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return lock(o, c.OutOrStdout())
		},
	}
	c.Flags().StringVar(&o.config, "config", "", "configuration file (YAML)")
	c.Flags().StringVar(&o.out, "out", "", "lockfile to write, or with --check to compare with (default: the policy's lockfile, else "+defaultLockfile+" beside the config)")
	c.Flags().BoolVar(&o.check, "check", false, "compare the live tools with the lockfile instead of writing it; exit 1 when they differ")
	c.Flags().DurationVar(&o.timeout, "timeout", 30*time.Second, "how long every server has to list its tools")
	c.Flags().BoolVar(&o.approved, "approved", false, "the definitions change control approved, from the running capsnap, not the live servers")
	c.Flags().StringVar(&o.admin, "admin", "", "with --approved, the running capsnap's admin listener (default: the config's admin_addr)")
	return c
}

func newPolicyCmd() *cobra.Command {
	return group(&cobra.Command{
		Use:     "policy",
		Short:   "Lint a policy, explain its decisions, test it, or reload it in a running capsnap",
		Example: "  capsnap policy lint policy.yaml\n  capsnap policy test policy_test.yaml",
	}, newPolicyLintCmd(), newPolicyExplainCmd(), newPolicyTestCmd(), newPolicyReloadCmd())
}

func newPolicyLintCmd() *cobra.Command {
	var (
		catalogs []string
		file     string
	)
	c := &cobra.Command{
		Use:   "lint (--policy FILE | FILE) [--catalog SERVER=TOOLS_JSON]...",
		Short: "Validate a policy file and print its warnings",
		Long: `Validate a policy file and print its warnings. With --catalog, a server's
tools/list result (as a catalog file holds it), every constraint and budget
amount that reads an argument the tool's inputSchema does not declare is an
error: exit 1. Warnings alone exit 0.`,
		Example: "  capsnap policy lint --policy policy.yaml\n  capsnap policy lint policy.yaml --catalog billing=billing-tools.json",
		Args:    policyArgs(&file),
		RunE: func(c *cobra.Command, args []string) error {
			return policyLint(file, catalogs, c.OutOrStdout(), c.ErrOrStderr())
		},
	}
	c.Flags().StringVar(&file, "policy", "", "policy file (or give it as the one argument)")
	c.Flags().StringArrayVar(&catalogs, "catalog", nil, "SERVER=FILE: hold the policy to the tools of a tools/list result (repeatable)")
	return c
}

// policyArgs is the arguments of a policy command: the policy file as
// --policy FILE or as its one argument, the same way to every policy
// command, into file.
func policyArgs(file *string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		switch {
		case len(args) == 0 && *file != "":
		case len(args) == 1 && *file == "":
			*file = args[0]
		default:
			return usageError{cmdName(c) + ": the policy is required, as --policy FILE or as the one argument"}
		}
		return nil
	}
}

func newPolicyExplainCmd() *cobra.Command {
	var o explainOptions
	c := &cobra.Command{
		Use:                   "explain (--policy FILE | FILE) --principal P --server S --tool T [--args JSON] [--at TIME]",
		DisableFlagsInUseLine: true,
		Short:                 "Print the policy's decision on a call, and why",
		Long: `Print the policy's decision on a call, and why: which principal rule decides,
the tool's effect class, the grant, and each rule of the call (constraints,
rate limits, budgets, sequence, approval, ...), evaluated over --args when
they are given, as of --at (RFC 3339; default now) where a rule reads the
time. Exit 0 when the call is allowed (or granted, its constraints not
evaluated without --args), 1 when it is denied.`,
		Example: `  capsnap policy explain --policy policy.yaml --principal spiffe://acme/agent/support \
    --server billing --tool refund --args '{"order_id":"A-100","amount":40}' \
    --at 2026-12-07T10:00:00+02:00`,
		Args: policyArgs(&o.file),
		RunE: func(c *cobra.Command, _ []string) error {
			return policyExplain(o, c.OutOrStdout())
		},
	}
	c.Flags().StringVar(&o.file, "policy", "", "policy file (or give it as the one argument)")
	c.Flags().StringVar(&o.principal, "principal", "", "principal (SPIFFE ID or JWT subject)")
	c.Flags().StringVar(&o.server, "server", "", "server_id")
	c.Flags().StringVar(&o.tool, "tool", "", "tool name")
	c.Flags().StringVar(&o.args, "args", "", "tool arguments as a JSON object (optional)")
	c.Flags().StringVar(&o.at, "at", "", "when the call is made, RFC 3339 (default now)")
	return c
}

func newPolicyReloadCmd() *cobra.Command {
	var o reloadOptions
	c := &cobra.Command{
		Use:                   "reload [--config FILE] [--admin ADDR] [--token-file FILE] [--allow-loosening --by WHO --reason WHY]",
		DisableFlagsInUseLine: true,
		Short:                 "Ask a running capsnap to reload its policy",
		Long: `Ask a running capsnap, on its admin listener, to reload its policy. Only this
command, with --allow-loosening, can put in force a policy that loosens the
one in force; --by and --reason say who accepts it and why, for the audit
trail. The acceptance is recorded in the store for exactly the files that
replica read, for 24h: every replica that shares the store puts the same
files in force as it next polls them, and refuses any other. With --config
it reads capsnap's configuration for where to ask (admin_addr) and the
token to ask with (admin.token_file).`,
		Example: `  capsnap policy reload --config /etc/capsnap/capsnap.yaml
  capsnap policy reload --admin 127.0.0.1:9002 --allow-loosening \
    --by alice@acme.example --reason 'INC-42: refunds up to USD 500 this week'`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return policyReload(o, c.OutOrStdout())
		},
	}
	adminFlags(c, &o.adminOptions)
	c.Flags().BoolVar(&o.loosen, "allow-loosening", false, "put the new policy in force even if it loosens the one in force, on every replica")
	c.Flags().StringVar(&o.by, "by", "", "with --allow-loosening, who accepts the looser policy")
	c.Flags().StringVar(&o.reason, "reason", "", "with --allow-loosening, why")
	return c
}

func newKeysCmd() *cobra.Command {
	return group(&cobra.Command{
		Use:     "keys",
		Short:   "Work with the envelope keys",
		Example: "  capsnap keys jwks --config capsnap.yaml > jwks.json",
	}, newKeysJWKSCmd())
}

func newKeysJWKSCmd() *cobra.Command {
	var path string
	c := &cobra.Command{
		Use:                   "jwks --config FILE",
		DisableFlagsInUseLine: true,
		Short:                 "Print the JWKS of the envelope keys, for the MCP servers' verifiers",
		Example:               "  capsnap keys jwks --config capsnap.yaml > jwks.json",
		Args:                  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if path == "" {
				return usageError{"keys jwks: exactly --config FILE is required"}
			}
			return keysJWKS(path, c.OutOrStdout())
		},
	}
	c.Flags().StringVar(&path, "config", "", "configuration file (YAML)")
	return c
}

func newAuditCmd() *cobra.Command {
	return group(&cobra.Command{
		Use:     "audit",
		Short:   "Work with the audit trail",
		Example: "  capsnap audit verify --jwks jwks.json audit.jsonl\n  capsnap audit query --reason schema_drift --since 1h audit.jsonl",
	}, newAuditVerifyCmd(), newAuditQueryCmd())
}

func newAuditVerifyCmd() *cobra.Command {
	var (
		jwksFile string
		live     bool
	)
	c := &cobra.Command{
		Use:                   "verify [--jwks FILE] [--live] AUDIT_FILE...",
		DisableFlagsInUseLine: true,
		Short:                 "Verify an audit trail: its chain, signed checkpoints and end",
		Long: `Verify an audit trail, its files oldest first: its chain, every checkpoint's
signature against the JWKS, and that it ends with capsnap's shutdown
checkpoint. Without --jwks, a trail capsnap wrote without envelope keys
verifies as unsigned (its chain intact; nothing proves it was not rewritten
whole), and a signed one asks for the JWKS. Exit 0: verified; 1: not, with
the first line removed, inserted or edited, or a truncated end; 2: usage,
or a file that cannot be read.`,
		Example: "  capsnap audit verify --jwks jwks.json audit.jsonl.1 audit.jsonl\n  capsnap audit verify --jwks jwks.json --live audit.jsonl\n  capsnap audit verify audit.jsonl   # a trail written without envelope keys",
		RunE: func(c *cobra.Command, args []string) error {
			return auditVerify(jwksFile, live, args, c.OutOrStdout())
		},
	}
	c.Flags().StringVar(&jwksFile, "jwks", "", "the JWKS of the keys that sign checkpoints (capsnap keys jwks)")
	c.Flags().BoolVar(&live, "live", false, "the trail is still being written: accept a tail younger than the checkpoint interval")
	return c
}

func newAuditQueryCmd() *cobra.Command {
	var (
		q            audit.Query
		since, until string
	)
	c := &cobra.Command{
		Use:                   "query [--principal P] [--server S] [--tool T] [--reason R] [--decision D] [--since T] [--until T] [AUDIT_FILE...]",
		DisableFlagsInUseLine: true,
		Short:                 "Select decisions from an audit trail, as JSON lines",
		Long: `Select the decision lines of an audit trail (its files in order, or stdin)
that match every filter given, and print them as they are, one JSON line
each. --since and --until take an RFC 3339 time or a duration back from now
(1h), and bound the line's time to [since, until). Exit 0: at least one line
matched; 1: none did; 2: usage, or a file that cannot be read.`,
		Example: "  capsnap audit query --principal spiffe://acme/agent/support --since 24h audit.jsonl\n" +
			"  capsnap audit query --decision deny --reason no_snapshot --server billing audit.jsonl.1 audit.jsonl | jq .detail",
		RunE: func(c *cobra.Command, args []string) error {
			return auditQuery(q, since, until, args, c.InOrStdin(), c.OutOrStdout(), time.Now())
		},
	}
	c.Flags().StringVar(&q.Principal, "principal", "", "the principal, exactly")
	c.Flags().StringVar(&q.Server, "server", "", "the server_id")
	c.Flags().StringVar(&q.Tool, "tool", "", "the tool")
	c.Flags().StringVar(&q.Reason, "reason", "", "the reason: ok, or a denial reason (docs/DENIALS.md)")
	c.Flags().StringVar(&q.Decision, "decision", "", "allow or deny")
	c.Flags().StringVar(&since, "since", "", "from this time (RFC 3339) or this long ago (a duration)")
	c.Flags().StringVar(&until, "until", "", "before this time (RFC 3339) or this long ago (a duration)")
	return c
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version and the commit capsnap was built from",
		Long: `Print capsnap's version, then the commit it was built from when the go
command stamped it: its revision, its time, and "modified" if the work tree
had changes. capsnap --version prints the same.`,
		Example: "  capsnap version",
		Args:    noArgs,
		Run: func(c *cobra.Command, _ []string) {
			fmt.Fprintln(c.OutOrStdout(), "capsnap", versionString())
		},
	}
}
