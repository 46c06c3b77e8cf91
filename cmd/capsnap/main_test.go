package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/capsnap/capsnap/mcpparse"
)

func TestCommands(t *testing.T) {
	type commandTest struct {
		name   string
		args   []string
		code   int
		stdout string // regexp
		stderr string // substring
	}
	tests := []commandTest{
		{"no args", nil, exitUsage, "", "Usage:\n  capsnap [flags]\n  capsnap [command]\n"},
		{"unknown command", []string{"frobnicate"}, exitUsage, "", `unknown command "frobnicate"`},
		{"misspelt command", []string{"serv", "--config", "testdata/ok.yaml"}, exitUsage, "", "unknown command \"serv\" for \"capsnap\"\n\nDid you mean this?\n\tserve\n"},
		{"unknown flag", []string{"--frobnicate"}, exitUsage, "", "unknown flag: --frobnicate"},
		{"unknown flag of a command", []string{"check", "--config", "testdata/ok.yaml", "--strict"}, exitUsage, "", "unknown flag: --strict\nRun 'capsnap check --help' for usage."},
		{"unknown flag of a subcommand", []string{"policy", "lint", "--fix", "testdata/seed-policy.yaml"}, exitUsage, "", "unknown flag: --fix"},
		{"flag without its value", []string{"check", "--config"}, exitUsage, "", "flag needs an argument: --config"},
		{"extra argument", []string{"check", "--config", "testdata/ok.yaml", "now"}, exitUsage, "", `check: unexpected argument "now"`},
		{"help on an unknown command", []string{"help", "frobnicate"}, exitUsage, "", `help: unknown command "frobnicate"`},
		{"help", []string{"help"}, exitOK, `(?s)^capsnap authorizes MCP tool calls.*Exit codes:\n  0  ok.*\n  1  a negative answer.*\n  2  usage.*Available Commands:.*completion`, ""},
		{"version", []string{"version"}, exitOK, `^capsnap \S+( rev [0-9a-f]+.*)?\n$`, ""},
		{"--version", []string{"--version"}, exitOK, `^capsnap \S+( rev [0-9a-f]+.*)?\n$`, ""},
		{"version with an argument", []string{"version", "now"}, exitUsage, "", `version: unexpected argument "now"`},
		{"completion bash", []string{"completion", "bash"}, exitOK, `(?s)^# bash completion V2 for capsnap.*complete -o default -F __start_capsnap capsnap`, ""},
		{"completion zsh", []string{"completion", "zsh"}, exitOK, `^#compdef capsnap\n`, ""},
		{"completion fish", []string{"completion", "fish"}, exitOK, `(?s)complete -c capsnap `, ""},
		{"completion powershell", []string{"completion", "powershell"}, exitOK, `(?s)Register-ArgumentCompleter .*capsnap`, ""},
		{"completion of an unknown shell", []string{"completion", "tcsh"}, exitUsage, "", `completion: unknown subcommand "tcsh"`},
		{"completion without a shell", []string{"completion"}, exitUsage, "", "completion: the subcommand bash, fish, powershell or zsh is required"},
		{"check ok", []string{"check", "--config", "testdata/ok.yaml"}, exitOK, `testdata/ok.yaml: ok \(1 servers, policy sha256:[0-9a-f]{64}, 3 tools from catalog files\)`, ""},
		{"policy lint against a catalog", []string{"policy", "lint", "testdata/typo-policy.yaml", "--catalog", "billing=testdata/tools.json"}, exitFailure, "^$",
			"testdata/typo-policy.yaml: error: tools[0].budgets[0].amount: reads args.amount_usd"},
		{"policy lint without a catalog", []string{"policy", "lint", "testdata/typo-policy.yaml"}, exitOK, `ok \(policy sha256:[0-9a-f]{64}, 0 warnings\)`, ""},
		{"policy lint bad catalog flag", []string{"policy", "lint", "testdata/typo-policy.yaml", "--catalog", "tools.json"}, exitUsage, "", `--catalog "tools.json" is not SERVER=FILE`},
		{"policy lint, a server's catalog twice", []string{"policy", "lint", "testdata/typo-policy.yaml", "--catalog", "billing=testdata/tools.json", "--catalog", "billing=testdata/response.json"}, exitUsage, "",
			"policy lint: --catalog billing is given twice; a server has one tools/list"},
		{"check a policy that holds calls for approval, approvals off", []string{"check", "--config", "testdata/approvals-off.yaml"}, exitFailure, "^$",
			"holds calls for a person's approval, but approvals.addr is not set"},
		{"check approvers' tokens that are not there", []string{"check", "--config", "testdata/approvals-no-tokens.yaml"}, exitFailure, "^$",
			"capsnap: approvals.auth: "},
		{"check a policy under change control, approvals off", []string{"check", "--config", "testdata/changes-off.yaml"}, exitFailure, "^$",
			"puts tools under change control, whose changes wait for reviewers, but approvals.addr is not set"},
		{"check an argument no tool has", []string{"check", "--config", "testdata/typo.yaml"}, exitFailure, "^$",
			"error: testdata/typo-policy.yaml: tools[0].constraints[0].expr: reads args.amount_usd, which the input schema of billing/refund does not declare (it declares amount, order_id, reason_code)"},
		{"check without config", []string{"check"}, exitUsage, "", "exactly --config FILE is required"},
		{"check the shipped envoy", []string{"check", "--config", "testdata/demo.yaml", "--envoy", "../../envoy/demo.yaml"}, exitOK,
			`ok \(2 servers, policy sha256:[0-9a-f]{64}, \.\./\.\./envoy/demo\.yaml: 0 warnings\)`, ""},
		{"check an envoy without ext_proc", []string{"check", "--config", "testdata/demo.yaml", "--envoy", "testdata/envoy-without-ext-proc.yaml"}, exitFailure, "^$",
			`error: testdata/envoy-without-ext-proc.yaml: static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters: the ext_authz filter sends Checks to cluster capsnap, but no ext_proc filter sends it responses`},
		{"check an envoy, catalog-bound", []string{"check", "--config", "testdata/demo-catalog-bind.yaml", "--envoy", "testdata/envoy-without-ext-proc.yaml"}, exitOK,
			`envoy-without-ext-proc\.yaml: 0 warnings\)`, ""},
		{"check an envoy whose route names no configured server", []string{"check", "--config", "testdata/ok.yaml", "--envoy", "../../envoy/demo.yaml"}, exitFailure, "^$",
			`context_extensions.server_id: "payments", want one of capsnap's servers (billing)`},
		{"check an envoy that is not there", []string{"check", "--config", "testdata/ok.yaml", "--envoy", "testdata/nope.yaml"}, exitFailure, "", "--envoy: open testdata/nope.yaml"},
		{"check an envoy that is not YAML", []string{"check", "--config", "testdata/ok.yaml", "--envoy", "testdata/envoy-broken.yaml"}, exitFailure, "", "--envoy testdata/envoy-broken.yaml: envoy: "},
		{"check missing file", []string{"check", "--config", "testdata/nope.yaml"}, exitFailure, "", "no such file"},
		{"check invalid policy", []string{"check", "--config", "testdata/bad-policy.yaml"}, exitFailure, "", `tools[0].effect: unknown effect class "superuser"`},
		{"check invalid catalog", []string{"check", "--config", "testdata/bad-catalog.yaml"}, exitFailure, "", `tool "a" is listed twice`},
		{"check redis secret too short", []string{"check", "--config", "testdata/redis-short-secret.yaml"}, exitFailure, "", "short.key holds 9 bytes, fewer than 32"},
		{"serve redis secret too short", []string{"serve", "--config", "testdata/redis-short-secret.yaml"}, exitFailure, "", "snapshots.redis.secret_file"},
		{"serve invalid policy", []string{"serve", "--config", "testdata/bad-policy.yaml"}, exitFailure, "", "unknown effect class"},
		{"digest", []string{"digest", "testdata/tools.json"}, exitOK, `^refund sha256:[0-9a-f]{64}\nlookup_order sha256:[0-9a-f]{64}\nexport_ledger sha256:[0-9a-f]{64}\n$`, ""},
		{"digest response", []string{"digest", "testdata/response.json"}, exitOK, `^refund sha256:[0-9a-f]{64}\n$`, ""},
		{"digest duplicate", []string{"digest", "testdata/dup-tools.json"}, exitFailure, "", "both named"},
		{"digest no file", []string{"digest"}, exitUsage, "", "exactly one FILE"},
		{"digest two files", []string{"digest", "testdata/tools.json", "testdata/response.json"}, exitUsage, "", "exactly one FILE"},
		{"keys jwks", []string{"keys", "jwks", "--config", "testdata/envelope.yaml"}, exitOK, `^\{"keys":\[\{"use":"sig","kty":"OKP","kid":"[A-Za-z0-9_-]{43}","crv":"Ed25519","alg":"EdDSA","x":"[A-Za-z0-9_-]{43}"\}\]\}\n$`, ""},
		{"keys jwks without envelope keys", []string{"keys", "jwks", "--config", "testdata/ok.yaml"}, exitFailure, "", "names no envelope.key_files"},
		{"keys without subcommand", []string{"keys"}, exitUsage, "", "the subcommand jwks is required"},
		{"keys jwks without config", []string{"keys", "jwks"}, exitUsage, "", "keys jwks: exactly --config FILE is required"},
		{"check envelope keys", []string{"check", "--config", "testdata/envelope.yaml"}, exitOK, `ok \(1 servers`, ""},
		{"check calls without listing", []string{"check", "--config", "testdata/without-listing.yaml"}, exitOK, `ok \(1 servers`, "warning: testdata/without-listing.yaml: server billing has calls_without_listing"},
		{"check a grant key", []string{"check", "--config", "testdata/grant.yaml"}, exitOK, `ok \(1 servers`, ""},
		{"check a grant key that is not a public key", []string{"check", "--config", "testdata/grant-private-key.yaml"}, exitFailure, "", `servers[0].grant_key_file: envelope: testdata/not-a-public-key.pem: want a PEM "PUBLIC KEY"`},
		{"policy without subcommand", []string{"policy"}, exitUsage, "", "explain, lint, reload or test is required"},
		{"policy unknown subcommand", []string{"policy", "explian", "--policy", "testdata/seed-policy.yaml"}, exitUsage, "", `policy: unknown subcommand "explian"; did you mean explain?`},
		{"policy with a flag, no subcommand", []string{"policy", "--policy", "testdata/seed-policy.yaml"}, exitUsage, "", "policy: the subcommand explain, lint, reload or test is required"},
		{"policy lint no file", []string{"policy", "lint"}, exitUsage, "", "policy lint: the policy is required, as --policy FILE or as the one argument"},
		{"policy lint, the policy twice", []string{"policy", "lint", "--policy", "testdata/seed-policy.yaml", "testdata/seed-policy.yaml"}, exitUsage, "", "as --policy FILE or as the one argument"},
		{"policy lint --policy", []string{"policy", "lint", "--policy", "testdata/seed-policy.yaml"}, exitOK, `seed-policy.yaml: ok \(policy sha256`, ""},
		{"policy explain, the policy as its argument", []string{"policy", "explain", "testdata/seed-policy.yaml", "--principal", "spiffe://acme/agent/support-refund",
			"--server", "billing", "--tool", "lookup_order"}, exitOK, "allowed", ""},
		{"policy lint", []string{"policy", "lint", "testdata/seed-policy.yaml"}, exitOK, `seed-policy.yaml: ok \(policy sha256:[0-9a-f]{64}, 0 warnings\)`, ""},
		{"policy lint --catalog, a saved JSON-RPC response", []string{"policy", "lint", "testdata/seed-policy.yaml", "--catalog", "billing=testdata/response.json"}, exitOK,
			`seed-policy.yaml: ok \(policy sha256:`, ""},
		{"policy lint invalid", []string{"policy", "lint", "testdata/broken-policy.yaml"}, exitFailure, "", `unknown effect class "superuser"`},
		{"policy explain allowed", []string{"policy", "explain", "--policy", "testdata/seed-policy.yaml",
			"--principal", "spiffe://acme/agent/support-refund", "--server", "billing", "--tool", "refund",
			"--args", `{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`}, exitOK, `(?s)money_move.*usd_cap_250.*holds`, ""},
		{"policy explain over the cap", []string{"policy", "explain", "--policy", "testdata/seed-policy.yaml",
			"--principal", "spiffe://acme/agent/support-refund", "--server", "billing", "--tool", "refund",
			"--args", `{"order_id":"A-100","amount":250.01,"reason_code":"duplicate_charge"}`}, exitFailure, `(?s)usd_cap_250.*DOES NOT HOLD.*denied \(constraint_violation\): usd_cap_250\n$`,
			`policy explain: DENIED (constraint_violation: constraint "usd_cap_250" does not hold`},
		{"policy explain, constraints not evaluated", []string{"policy", "explain", "--policy", "testdata/seed-policy.yaml",
			"--principal", "spiffe://acme/agent/support-refund", "--server", "billing", "--tool", "refund"}, exitOK,
			`(?s)usd_cap_250.*not evaluated, no arguments given.*granted; its constraints decide each call\n$`, ""},
		{"policy explain, an argument missing", []string{"policy", "explain", "--policy", "testdata/seed-policy.yaml",
			"--principal", "spiffe://acme/agent/support-refund", "--server", "billing", "--tool", "refund",
			"--args", `{"order_id":"A-100","amount":40}`}, exitFailure, `denied \(constraint_violation\): reason_allowlist\n$`,
			`policy explain: DENIED (constraint_violation: constraint "reason_allowlist" could not be evaluated`},
		{"policy explain not granted", []string{"policy", "explain", "--policy", "testdata/seed-policy.yaml",
			"--principal", "spiffe://acme/agent/support-readonly", "--server", "billing", "--tool", "refund"}, exitFailure,
			`denied \(tool_not_granted\): it is in no grant\n$`, "policy explain: DENIED (tool_not_granted: "},
		{"policy explain, no principal rule", []string{"policy", "explain", "--policy", "testdata/seed-policy.yaml",
			"--principal", "spiffe://acme/agent/stranger", "--server", "billing", "--tool", "refund"}, exitFailure,
			`denied \(tool_not_granted\): no principal rule matches\n$`, "policy explain: DENIED (tool_not_granted: "},
		{"policy explain unclassified", []string{"policy", "explain", "--policy", "testdata/seed-policy.yaml",
			"--principal", "spiffe://acme/agent/support-refund", "--server", "billing", "--tool", "drop_tables"}, exitFailure,
			`denied \(unclassified_tool\)\n$`, "policy explain: DENIED (unclassified_tool: "},
		{"policy explain --at, inside the schedule", []string{"policy", "explain", "--policy", "../../policy/testdata/schedule.yaml",
			"--principal", "spiffe://acme/agent/support-refund", "--server", "billing", "--tool", "refund",
			"--args", `{"amount":40}`, "--at", "2026-12-07T10:00:00+02:00"}, exitOK,
			`(?s)inside at Mon 2026-12-07 10:00 EET.*allowed, if its rate limits have room\n$`, ""},
		{"policy explain --at, outside the schedule", []string{"policy", "explain", "--policy", "../../policy/testdata/schedule.yaml",
			"--principal", "spiffe://acme/agent/support-refund", "--server", "billing", "--tool", "refund", "--at", "2026-12-12T10:00:00+02:00"}, exitFailure,
			`(?s)OUTSIDE at Sat 2026-12-12 10:00 EET; the next window opens 2026-12-14T09:00:00\+02:00\n.*\ndenied \(outside_schedule\): tools\[0\]\.schedule\n$`,
			`policy explain: DENIED (outside_schedule: billing/refund may be called only mon,tue,wed,thu,fri 09:00-17:00 Europe/Tallinn`},
		{"policy explain bad --at", []string{"policy", "explain", "--policy", "testdata/seed-policy.yaml",
			"--principal", "p", "--server", "billing", "--tool", "refund", "--at", "tomorrow"}, exitUsage, "", "--at is not an RFC 3339 time"},
		{"policy explain bad args", []string{"policy", "explain", "--policy", "testdata/seed-policy.yaml",
			"--principal", "p", "--server", "billing", "--tool", "refund", "--args", "[1]"}, exitUsage, "", "--args is not a JSON object"},
		{"policy explain missing flags", []string{"policy", "explain", "--policy", "testdata/seed-policy.yaml", "--tool", "refund"}, exitUsage, "", "--principal, --server and --tool are required"},
		{"policy explain without the policy", []string{"policy", "explain", "--tool", "refund"}, exitUsage, "", "the policy is required"},
		{"policy reload unreachable", []string{"policy", "reload", "--admin", "127.0.0.1:1"}, exitFailure, "", "policy reload"},
		{"audit verify ok", verifyArgs(auditData + "trail.jsonl"), exitOK,
			`^testdata/audit/trail.jsonl: verified: 8 lines \(last seq 8\), 2 checkpoints signed by \S+; ends with capsnap's shutdown checkpoint\n$`, ""},
		{"audit verify deleted line", verifyArgs(auditData + "deleted.jsonl"), exitFailure,
			`^testdata/audit/deleted.jsonl:2 \(seq 3\): removed: seq 2 is missing`, "NOT VERIFIED"},
		{"audit verify edited line", verifyArgs(auditData + "edited.jsonl"), exitFailure,
			`^testdata/audit/edited.jsonl:2 \(seq 2\): edited: `, "NOT VERIFIED"},
		{"audit verify inserted line", verifyArgs(auditData + "inserted.jsonl"), exitFailure,
			`^testdata/audit/inserted.jsonl:3: inserted: not a chained trail line`, "NOT VERIFIED"},
		{"audit verify truncated", verifyArgs(auditData + "truncated.jsonl"), exitFailure,
			`^testdata/audit/truncated.jsonl:6 \(seq 6\): truncated: the trail ends without capsnap's shutdown checkpoint; no signed checkpoint covers the 2 lines after the last one, at testdata/audit/truncated.jsonl:4`, "NOT VERIFIED"},
		{"audit verify truncated, live, long ago", append(verifyArgs("--live"), auditData+"truncated.jsonl"), exitFailure,
			`^testdata/audit/truncated.jsonl:5 \(seq 5\): truncated: no checkpoint covers this line`, "NOT VERIFIED"},
		{"audit verify forged checkpoint", verifyArgs(auditData + "forged.jsonl"), exitFailure,
			`^testdata/audit/forged.jsonl:4 \(seq 4\): forged: the checkpoint's signature does not verify`, "NOT VERIFIED"},
		{"audit verify unknown key", []string{"audit", "verify", "--jwks", auditData + "other-jwks.json", auditData + "trail.jsonl"}, exitFailure,
			`^testdata/audit/trail.jsonl:4 \(seq 4\): unknown_key: `, "NOT VERIFIED"},
		{"audit query by tool", []string{"audit", "query", "--tool", "refund", auditData + "trail.jsonl"}, exitOK,
			`^(\{[^\n]*"request_id":"req-[0-9]+"[^\n]*"tool":"refund"[^\n]*\}\n)+$`, ""},
		{"audit query, nothing matched", []string{"audit", "query", "--principal", "nobody", auditData + "trail.jsonl"}, exitFailure, "^$", "no line matched"},
		{"audit query, until before the trail", []string{"audit", "query", "--until", "2026-03-01T12:00:00Z", auditData + "trail.jsonl"}, exitFailure, "^$", "no line matched"},
		{"audit query bad since", []string{"audit", "query", "--since", "yesterday", auditData + "trail.jsonl"}, exitUsage, "", `--since: "yesterday" is neither`},
		{"audit query bad decision", []string{"audit", "query", "--decision", "maybe", auditData + "trail.jsonl"}, exitUsage, "", `--decision "maybe" is not allow or deny`},
		{"audit query missing file", []string{"audit", "query", auditData + "nope.jsonl"}, exitFailure, "", "no such file"},
		{"audit query not a trail", []string{"audit", "query", "testdata/seed-policy.yaml"}, exitFailure, "", "line 1"},
		{"audit without subcommand", []string{"audit"}, exitUsage, "", "query or verify is required"},
		{"audit unknown subcommand", []string{"audit", "prune"}, exitUsage, "", `unknown subcommand "prune"`},
		{"audit verify a signed trail without jwks", []string{"audit", "verify", auditData + "trail.jsonl"}, exitFailure,
			`unknown_key: .*\nits checkpoints are signed: give --jwks`, "NOT VERIFIED"},
		{"audit verify an unsigned trail", []string{"audit", "verify", auditData + "unsigned.jsonl"}, exitOK,
			`^testdata/audit/unsigned.jsonl: verified as unsigned: 8 lines, the chain intact \(last seq 8\)`, ""},
		{"audit verify an unsigned trail with jwks", verifyArgs(auditData + "unsigned.jsonl"), exitFailure,
			`unsigned: `, "NOT VERIFIED"},
		{"audit verify without file", verifyArgs(), exitUsage, "", "at least one audit FILE"},
		{"audit verify missing file", verifyArgs(auditData + "nope.jsonl"), exitFailure, "", "no such file"},
		{"audit verify jwks not a JWKS", []string{"audit", "verify", "--jwks", auditData + "trail.jsonl", auditData + "trail.jsonl"}, exitFailure, "", "is not a JWKS"},
	}
	// A file a command cannot read is a failure of the run, the same
	// exit from every command that names one, and the error names it.
	const nope = "testdata/nope"
	for _, args := range [][]string{
		{"serve", "--config", nope},
		{"check", "--config", nope},
		{"check", "--config", "testdata/ok.yaml", "--envoy", nope},
		{"digest", nope},
		{"lock", "--config", nope},
		{"policy", "lint", nope},
		{"policy", "explain", "--policy", nope, "--principal", "p", "--server", "s", "--tool", "t"},
		{"policy", "test", "--policy", nope, "testdata/policytest/catalog.yaml"},
		{"policy", "reload", "--config", nope},
		{"keys", "jwks", "--config", nope},
		{"audit", "verify", "--jwks", nope, auditData + "trail.jsonl"},
		{"audit", "verify", "--jwks", auditData + "jwks.json", nope},
		{"audit", "query", nope},
		{"approvals", "list", "--url", "http://127.0.0.1:1", "--token-file", nope},
		{"budgets", "show", "--config", nope, "--principal", "p", "--server", "s", "--tool", "t"},
	} {
		tests = append(tests, commandTest{"unreadable: " + strings.Join(args, " "), args, exitFailure, "", "open " + nope})
	}
	// --help, -h and help on every command and subcommand: its usage and
	// its examples, on stdout.
	root, _ := newRootCmd(io.Discard, io.Discard)
	for _, c := range allCommands(root) {
		path := strings.Fields(c.CommandPath())[1:]
		want := `(?s)Usage:\n  ` + regexp.QuoteMeta(c.CommandPath()) + `\b.*\nExamples:\n  \S`
		for _, args := range [][]string{
			slices.Concat(path, []string{"--help"}),
			slices.Concat(path, []string{"-h"}),
			slices.Concat([]string{"help"}, path),
		} {
			tests = append(tests, commandTest{strings.Join(args, " "), args, exitOK, want, ""})
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, &stdout, &stderr)
			}
			if tt.stdout != "" && !regexp.MustCompile(tt.stdout).MatchString(stdout.String()) {
				t.Errorf("stdout %q does not match %s", &stdout, tt.stdout)
			}
			if !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr %q does not contain %q", &stderr, tt.stderr)
			}
		})
	}
}

// allCommands is root and every command under it, as cobra has them
// before it runs: help and completion included.
func allCommands(root *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{root}
	for _, c := range root.Commands() {
		out = append(out, allCommands(c)...)
	}
	return out
}

// The digest command and the library agree, and a whole response and its
// bare result give the same digest.
func TestDigestMatchesLibrary(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "tools.json"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := mcpparse.ToolsDigests(data)
	if err != nil {
		t.Fatal(err)
	}
	var a, b bytes.Buffer
	if run([]string{"digest", "testdata/tools.json"}, &a, new(bytes.Buffer)) != exitOK ||
		run([]string{"digest", "testdata/response.json"}, &b, new(bytes.Buffer)) != exitOK {
		t.Fatal("digest failed")
	}
	if first := strings.SplitN(a.String(), "\n", 2)[0]; first != want[0].Name+" "+want[0].Digest {
		t.Errorf("first line %q, want %s %s", first, want[0].Name, want[0].Digest)
	}
	if strings.TrimSpace(b.String()) != want[0].Name+" "+want[0].Digest {
		t.Errorf("response form gave %q, want the same digest as the result form", b.String())
	}
}

// Profiles are served only when debug.pprof asks for them.
func TestAdminPprof(t *testing.T) {
	for _, on := range []bool{false, true} {
		mux := adminMux(nil, prometheus.NewRegistry(), nil, "", on, zerolog.Nop())
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/heap"} {
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			want := http.StatusNotFound
			if on {
				want = http.StatusOK
			}
			if rec.Code != want {
				t.Errorf("pprof %v: GET %s = %d, want %d", on, path, rec.Code, want)
			}
		}
	}
}

// The version names the commit when the go command stamped one, and is
// the set or module version alone when it did not.
func TestFormatVersion(t *testing.T) {
	stamped := func(v string, settings ...debug.BuildSetting) *debug.BuildInfo {
		bi := &debug.BuildInfo{Settings: settings}
		bi.Main.Version = v
		return bi
	}
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "45bf4dd1b2c3d4e5f60718293a4b5c6d7e8f9012"}
	at := debug.BuildSetting{Key: "vcs.time", Value: "2026-12-05T06:00:00Z"}
	tests := []struct {
		name string
		set  string
		bi   *debug.BuildInfo
		want string
	}{
		{"no build info", "", nil, "(devel)"},
		{"set, no build info", "v1.4.0", nil, "v1.4.0"},
		{"a checkout, not stamped", "", stamped("(devel)"), "(devel)"},
		{"a checkout", "", stamped("(devel)", debug.BuildSetting{Key: "vcs", Value: "git"}, rev, at, debug.BuildSetting{Key: "vcs.modified", Value: "false"}),
			"(devel) rev 45bf4dd1b2c3d4e5f60718293a4b5c6d7e8f9012 2026-12-05T06:00:00Z"},
		{"a modified checkout", "", stamped("(devel)", rev, at, debug.BuildSetting{Key: "vcs.modified", Value: "true"}),
			"(devel) rev 45bf4dd1b2c3d4e5f60718293a4b5c6d7e8f9012 2026-12-05T06:00:00Z modified"},
		{"a checkout, Go 1.24's pseudo-version", "", stamped("v0.0.0-20261205060000-45bf4dd1b2c3+dirty", rev, at, debug.BuildSetting{Key: "vcs.modified", Value: "true"}),
			"v0.0.0-20261205060000-45bf4dd1b2c3+dirty rev 45bf4dd1b2c3d4e5f60718293a4b5c6d7e8f9012 2026-12-05T06:00:00Z modified"},
		{"a revision without a time", "", stamped("(devel)", rev), "(devel) rev 45bf4dd1b2c3d4e5f60718293a4b5c6d7e8f9012"},
		{"go install of a release", "", stamped("v1.4.0"), "v1.4.0"},
		{"set by -X, and stamped", "v1.4.0-rc1", stamped("(devel)", rev, at), "v1.4.0-rc1 rev 45bf4dd1b2c3d4e5f60718293a4b5c6d7e8f9012 2026-12-05T06:00:00Z"},
		{"no module version", "", stamped(""), "(devel)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := formatVersion(tt.set, tt.bi); got != tt.want {
				t.Errorf("formatVersion = %q, want %q", got, tt.want)
			}
		})
	}
}
