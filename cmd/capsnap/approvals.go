package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/capsnap/capsnap/approval"
)

// `capsnap approvals`: the approval listener's JSON API from a terminal,
// as one approver.

const (
	approvalsURLEnv   = "CAPSNAP_APPROVALS_URL"
	approverTokenEnv  = "CAPSNAP_APPROVER_TOKEN"
	approvalsExitHelp = `Exit codes: 0 done; 1 the API refused (its error code is printed: not_found,
expired, already_decided, not_an_approver, self_approval, unauthenticated,
store_unavailable) or could not be reached; 2 usage.`
)

// approvalsOptions are the flags of the approvals subcommands.
type approvalsOptions struct {
	url, tokenFile   string
	timeout          time.Duration
	json             bool
	state, principal string
	reason           string
}

func newApprovalsCmd() *cobra.Command {
	return group(&cobra.Command{
		Use:   "approvals",
		Short: "List, show, approve or deny the tool calls waiting for a person",
		Long: `List, show, approve or deny the tool calls a policy holds for a person's
approval, on the approval listener's JSON API, as the approver whose token
is in --token-file or $` + approverTokenEnv + `.

` + approvalsExitHelp,
		Example: "  export " + approvalsURLEnv + "=https://approvals.acme.example\n  capsnap approvals list --token-file ~/.config/capsnap/approver-token",
	}, newApprovalsListCmd(), newApprovalsShowCmd(), newApprovalsDecideCmd(true), newApprovalsDecideCmd(false))
}

// approvalsFlags adds the flags every approvals subcommand takes.
func approvalsFlags(c *cobra.Command, o *approvalsOptions) {
	c.Flags().StringVar(&o.url, "url", "", "the approval listener's URL (default $"+approvalsURLEnv+")")
	c.Flags().StringVar(&o.tokenFile, "token-file", "", "a file holding the approver's token (default: the token in $"+approverTokenEnv+")")
	c.Flags().DurationVar(&o.timeout, "timeout", 10*time.Second, "how long the API has to answer")
}

func newApprovalsListCmd() *cobra.Command {
	var o approvalsOptions
	c := &cobra.Command{
		Use:                   "list [--state STATE] [--principal P] [--json] [--url URL] [--token-file FILE]",
		DisableFlagsInUseLine: true,
		Short:                 "List the requests you may decide, newest first",
		Long: `List the approval requests you may decide, newest first: all, or those in one
state (pending, approved, denied, consumed, expired) or of one principal.

` + approvalsExitHelp,
		Example: "  capsnap approvals list --state pending\n  capsnap approvals list --principal spiffe://acme/agent/support --json",
		Args:    noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return approvalsList(o, c.OutOrStdout())
		},
	}
	approvalsFlags(c, &o)
	c.Flags().StringVar(&o.state, "state", "", "only requests in this state")
	c.Flags().StringVar(&o.principal, "principal", "", "only requests of this principal")
	c.Flags().BoolVar(&o.json, "json", false, "print the API's JSON")
	return c
}

func newApprovalsShowCmd() *cobra.Command {
	var o approvalsOptions
	c := &cobra.Command{
		Use:                   "show ID [--json] [--url URL] [--token-file FILE]",
		DisableFlagsInUseLine: true,
		Short:                 "Show one request: who asks, the tool, the exact arguments, the rule",
		Long: `Show one approval request: who asks, which server and tool, the pinned
schema and policy digests, the effect class, the exact arguments and the
policy rule that asked.

` + approvalsExitHelp,
		Example: "  capsnap approvals show 3q2-7wEjRJ6kUjWrUTx5XA",
		Args:    oneID,
		RunE: func(c *cobra.Command, args []string) error {
			return approvalsShow(o, args[0], c.OutOrStdout())
		},
	}
	approvalsFlags(c, &o)
	c.Flags().BoolVar(&o.json, "json", false, "print the API's JSON")
	return c
}

func newApprovalsDecideCmd(approve bool) *cobra.Command {
	var o approvalsOptions
	name, short := "deny", "Deny a request"
	if approve {
		name, short = "approve", "Approve a request: the identical call may then run once"
	}
	c := &cobra.Command{
		Use:                   name + " ID [--reason TEXT] [--url URL] [--token-file FILE]",
		DisableFlagsInUseLine: true,
		Short:                 short,
		Long: short + `. Look at it first with capsnap approvals show; the
reason is recorded in the audit trail.

` + approvalsExitHelp,
		Example: "  capsnap approvals " + name + " 3q2-7wEjRJ6kUjWrUTx5XA --reason 'order A-100 checked'",
		Args:    oneID,
		RunE: func(c *cobra.Command, args []string) error {
			return approvalsDecide(o, args[0], approve, c.OutOrStdout())
		},
	}
	approvalsFlags(c, &o)
	c.Flags().StringVar(&o.reason, "reason", "", "why, for the audit trail")
	return c
}

// oneID is the arguments of a command that takes one request id.
func oneID(c *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usageError{cmdName(c) + ": exactly one request ID is required"}
	}
	return nil
}

// client is the API client o describes.
func (o approvalsOptions) client(cmd string) (*approval.Client, error) {
	u := o.url
	if u == "" {
		u = os.Getenv(approvalsURLEnv)
	}
	if u == "" {
		return nil, usageError{fmt.Sprintf("approvals %s: --url or $%s is required", cmd, approvalsURLEnv)}
	}
	token := os.Getenv(approverTokenEnv)
	if o.tokenFile != "" {
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("approvals %s: --token-file: %w", cmd, err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return nil, fmt.Errorf("approvals %s: --token-file %s is empty", cmd, o.tokenFile)
		}
	}
	if token == "" {
		return nil, usageError{fmt.Sprintf("approvals %s: --token-file or $%s is required", cmd, approverTokenEnv)}
	}
	return &approval.Client{URL: u, Token: token, HTTP: &http.Client{Timeout: o.timeout}}, nil
}

func (o approvalsOptions) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), o.timeout)
}

// refusal says which command the API refused, and why.
func refusal(cmd string, err error) error {
	var e *approval.APIError
	if errors.As(err, &e) {
		return fmt.Errorf("approvals %s: refused: %w", cmd, e)
	}
	return fmt.Errorf("approvals %s: %w", cmd, err)
}

func approvalsList(o approvalsOptions, stdout io.Writer) error {
	c, err := o.client("list")
	if err != nil {
		return err
	}
	ctx, cancel := o.ctx()
	defer cancel()
	views, err := c.List(ctx, approval.Filter{State: approval.State(o.state), Principal: o.principal})
	if err != nil {
		return refusal("list", err)
	}
	if o.json {
		// The API's own shape: one object, so that a field can be added
		// beside the list without breaking a reader.
		if views == nil {
			views = []approval.View{}
		}
		return printJSON(stdout, map[string][]approval.View{"approvals": views})
	}
	if len(views) == 0 {
		fmt.Fprintln(stdout, "no approval requests")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tPRINCIPAL\tSERVER\tTOOL\tEFFECT\tEXPIRES")
	for _, v := range views {
		b := v.Binding
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", safe(v.ID), v.State, safe(b.Principal), safe(b.Server), safe(b.Tool),
			safe(v.EffectClass), v.Expires.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

func approvalsShow(o approvalsOptions, id string, stdout io.Writer) error {
	c, err := o.client("show")
	if err != nil {
		return err
	}
	ctx, cancel := o.ctx()
	defer cancel()
	v, err := c.Get(ctx, id)
	if err != nil {
		return refusal("show", err)
	}
	if o.json {
		return printJSON(stdout, v)
	}
	return printRequest(stdout, v)
}

func approvalsDecide(o approvalsOptions, id string, approve bool, stdout io.Writer) error {
	cmd := "deny"
	if approve {
		cmd = "approve"
	}
	c, err := o.client(cmd)
	if err != nil {
		return err
	}
	ctx, cancel := o.ctx()
	defer cancel()
	v, err := c.Decide(ctx, id, approve, o.reason)
	if err != nil {
		return refusal(cmd, err)
	}
	if approve {
		fmt.Fprintf(stdout, "approved %s: the call may run once, until %s\n", safe(v.ID), v.Expires.UTC().Format(time.RFC3339))
	} else {
		fmt.Fprintf(stdout, "denied %s\n", safe(v.ID))
	}
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printRequest(w io.Writer, v approval.View) error {
	b := v.Binding
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	row := func(k, val string) { fmt.Fprintf(tw, "%s:\t%s\n", k, safe(val)) }
	row("id", v.ID)
	row("state", string(v.State))
	row("principal", b.Principal)
	row("server", b.Server)
	row("tool", b.Tool)
	row("effect class", v.EffectClass)
	row("rule", v.Rule)
	row("schema digest", b.SchemaDigest)
	row("policy digest", b.PolicyDigest)
	row("args digest", b.ArgsDigest)
	row("approvers", strings.Join(v.Approvers, ", "))
	row("created", v.Created.UTC().Format(time.RFC3339))
	row("expires", v.Expires.UTC().Format(time.RFC3339))
	if v.DecidedBy != "" {
		row("decided by", v.DecidedBy)
		row("decided at", v.DecidedAt.UTC().Format(time.RFC3339))
	}
	if v.Reason != "" {
		row("reason", v.Reason)
	}
	row("url", v.URL)
	if err := tw.Flush(); err != nil {
		return err
	}
	if v.Change != nil {
		return printChange(w, v.Change)
	}
	var args bytes.Buffer
	if json.Indent(&args, v.Arguments, "", "  ") != nil {
		args.Reset()
		args.Write(v.Arguments)
	}
	_, err := fmt.Fprintf(w, "arguments:\n%s\n", safe(args.String()))
	return err
}

// printChange prints what a review of a changed definition shows: each
// change, the description's words added (+) and removed (-), and the
// definition under review.
func printChange(w io.Writer, c *approval.Change) error {
	var diff struct {
		Changes []struct {
			Kind  string          `json:"kind"`
			Field string          `json:"field"`
			To    json.RawMessage `json:"to"`
			Words []struct {
				Op   string `json:"op"`
				Text string `json:"text"`
			} `json:"words"`
		} `json:"changes"`
	}
	_ = json.Unmarshal(c.Diff, &diff) // capsnap wrote it; unreadable lists nothing
	from := c.From
	if from == "" {
		from = "none: first seen"
	}
	fmt.Fprintf(w, "approved definition: %s\ngranted to: %s\nchanges:\n", from, safe(strings.Join(c.Granted, ", ")))
	for _, ch := range diff.Changes {
		fmt.Fprintf(w, "  %s %s\n", ch.Kind, safe(ch.Field))
		for _, word := range ch.Words {
			if word.Op != "=" {
				fmt.Fprintf(w, "      %s %s\n", word.Op, safe(word.Text))
			}
		}
	}
	var def bytes.Buffer
	if json.Indent(&def, []byte(c.Definition), "", "  ") != nil {
		def.Reset()
		def.WriteString(c.Definition)
	}
	_, err := fmt.Fprintf(w, "definition under review:\n%s\n", safe(def.String()))
	return err
}

// safe is s with every control character but a newline, and every
// bidirectional control, shown as U+FFFD: what an agent put in its
// arguments must not move the cursor, recolour or reorder an approver's
// terminal.
func safe(s string) string {
	return strings.Map(func(r rune) rune {
		if r != '\n' && (unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)) {
			return unicode.ReplacementChar
		}
		return r
	}, s)
}
