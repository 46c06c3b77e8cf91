package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/store"
)

// `capsnap budgets`: the counters of the budgets and rate limits of a
// principal's calls, as the store of a running capsnap holds them under
// the policy in force, read and reset through its admin listener: the
// replica knows the policy in force and its store, memory or shared.

const budgetsExitHelp = `Exit codes: 0 done; 1 capsnap refused (its answer is printed: not_found,
bad_request, store_unavailable, unauthorized) or could not be reached;
2 usage.`

// budgetsOptions are the flags of the budgets subcommands.
type budgetsOptions struct {
	adminOptions
	principal, server, tool, rule string
	json                          bool
	by, reason                    string
}

func newBudgetsCmd() *cobra.Command {
	return group(&cobra.Command{
		Use:   "budgets",
		Short: "Show or reset the counters of a principal's budgets and rate limits",
		Long: `Show or reset the counters of the budgets and rate limits that count a
principal's calls of a tool, as the store of a running capsnap holds them
under the policy in force, through its admin listener (--config, --admin,
--token-file as for capsnap policy reload).

` + budgetsExitHelp,
		Example: "  capsnap budgets show --config /etc/capsnap/capsnap.yaml --principal spiffe://acme/agent/support --server billing --tool refund",
	}, newBudgetsShowCmd(), newBudgetsResetCmd())
}

// budgetsFlags adds the flags every budgets subcommand takes.
func budgetsFlags(c *cobra.Command, o *budgetsOptions) {
	adminFlags(c, &o.adminOptions)
	c.Flags().StringVar(&o.principal, "principal", "", "the principal whose calls are counted (SPIFFE ID or JWT subject)")
	c.Flags().StringVar(&o.server, "server", "", "server_id")
	c.Flags().StringVar(&o.tool, "tool", "", "tool name")
}

func newBudgetsShowCmd() *cobra.Command {
	var o budgetsOptions
	c := &cobra.Command{
		Use:                   "show --principal P --server S --tool T [--rule NAME] [--json] [--config FILE] [--admin ADDR] [--token-file FILE]",
		DisableFlagsInUseLine: true,
		Short:                 "Show what each budget and rate limit of a principal's calls holds",
		Long: `Show the counters of the budgets and rate limits that count the principal's
calls of the tool, in the order a call is charged: what each holds of its
limit, its window, when the oldest of it stops counting (FREES AT) and when
all of it has (RESETS AT). Budgets count in their own units, rate limits in
calls. --rule keeps one: its name, or where the policy declares it (RULE).

` + budgetsExitHelp,
		Example: `  capsnap budgets show --config /etc/capsnap/capsnap.yaml \
    --principal spiffe://acme/agent/support --server billing --tool refund
  capsnap budgets show --admin 127.0.0.1:9002 --principal spiffe://acme/agent/support \
    --server billing --tool refund --rule daily_refunds --json`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return budgetsShow(o, c.OutOrStdout())
		},
	}
	budgetsFlags(c, &o)
	c.Flags().StringVar(&o.rule, "rule", "", "only this budget or rate limit: its name, or where the policy declares it")
	c.Flags().BoolVar(&o.json, "json", false, "print the admin API's JSON")
	return c
}

func newBudgetsResetCmd() *cobra.Command {
	var o budgetsOptions
	c := &cobra.Command{
		Use:                   "reset --principal P --server S --tool T --rule NAME --by WHO --reason WHY [--config FILE] [--admin ADDR] [--token-file FILE]",
		DisableFlagsInUseLine: true,
		Short:                 "Empty one counter: the principal has the budget's or rate limit's whole window again",
		Long: `Empty the counter of one budget or rate limit of the principal's calls of the
tool in the running capsnap's store, and so for every replica that shares
it: the principal has the whole window again. --rule names it (as budgets show lists it: its name, or where
the policy declares it when two share the name). The reset is audited
(counter_reset) with what the counter held, --by and --reason, and counted
(capsnap_limit_resets_total).

` + budgetsExitHelp,
		Example: `  capsnap budgets reset --config /etc/capsnap/capsnap.yaml \
    --principal spiffe://acme/agent/support --server billing --tool refund \
    --rule daily_refunds --by alice@acme.example --reason 'INC-42: refunds the upstream failed'`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return budgetsReset(o, c.OutOrStdout())
		},
	}
	budgetsFlags(c, &o)
	c.Flags().StringVar(&o.rule, "rule", "", "the budget or rate limit: its name, or where the policy declares it")
	c.Flags().StringVar(&o.by, "by", "", "who resets it, for the audit trail")
	c.Flags().StringVar(&o.reason, "reason", "", "why, for the audit trail")
	return c
}

// query is the call o names, as the admin API takes it, or a usage error
// naming what cmd lacks.
func (o budgetsOptions) query(cmd string) (url.Values, error) {
	q := url.Values{}
	for _, f := range []struct{ flag, param, value string }{
		{"--principal", "principal", o.principal}, {"--server", "server", o.server}, {"--tool", "tool", o.tool},
	} {
		if f.value == "" {
			return nil, usageError{fmt.Sprintf("budgets %s: --principal, --server and --tool are required", cmd)}
		}
		q.Set(f.param, f.value)
	}
	if o.rule != "" {
		q.Set("rule", o.rule)
	}
	return q, nil
}

func budgetsShow(o budgetsOptions, stdout io.Writer) error {
	q, err := o.query("show")
	if err != nil {
		return err
	}
	var out struct {
		Counters []decide.Counter `json:"counters"`
	}
	if err := o.ask("budgets show", http.MethodGet, "/budgets", q, &out); err != nil {
		return err
	}
	if o.json {
		if out.Counters == nil {
			out.Counters = []decide.Counter{}
		}
		return printJSON(stdout, out)
	}
	if len(out.Counters) == 0 {
		fmt.Fprintf(stdout, "no budget or rate limit counts %s's calls of %s/%s\n", safe(o.principal), safe(o.server), safe(o.tool))
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tRULE\tUSED\tLIMIT\tWINDOW\tFREES AT\tRESETS AT")
	for _, c := range out.Counters {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", safe(c.Kind), safe(c.Name), safe(c.Rule), amount(c.Used), amount(c.Limit),
			safe(c.Window), when(c.FreesAt), when(c.ResetsAt))
	}
	return tw.Flush()
}

func budgetsReset(o budgetsOptions, stdout io.Writer) error {
	q, err := o.query("reset")
	switch {
	case err != nil:
		return err
	case o.rule == "" || o.by == "" || o.reason == "":
		return usageError{"budgets reset: --rule, --by and --reason are required"}
	}
	q.Set("by", o.by)
	q.Set("reason", o.reason)
	var out struct {
		Counter decide.Counter `json:"counter"`
	}
	if err := o.ask("budgets reset", http.MethodPost, "/budgets/reset", q, &out); err != nil {
		return err
	}
	c := out.Counter
	fmt.Fprintf(stdout, "reset %s %s (%s) of %s on %s/%s: it held %s of %s per %s\n", safe(c.Kind), safe(c.Name), safe(c.Rule),
		safe(o.principal), safe(o.server), safe(o.tool), amount(c.Used), amount(c.Limit), safe(c.Window))
	return nil
}

func amount(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// serveBudgets adds the budgets' endpoints to the admin listener: GET
// /budgets shows the counters of a principal's calls of a tool, POST
// /budgets/reset empties one. Both name principals, so both need the
// admin token when there is one (needsToken).
func serveBudgets(mux *http.ServeMux, srv *decide.Server, log zerolog.Logger) {
	mux.HandleFunc("GET /budgets", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		principal, server, tool, err := budgetsCall(q)
		var counters []decide.Counter
		if err == nil {
			counters, err = srv.Counters(principal, server, tool, q.Get("rule"))
		}
		budgetsAnswer(w, err, map[string]any{"counters": counters})
	})
	mux.HandleFunc("POST /budgets/reset", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		by := decide.Signoff{By: q.Get("by"), Reason: q.Get("reason")}
		principal, server, tool, err := budgetsCall(q)
		var held decide.Counter
		if err == nil {
			held, err = srv.ResetCounter(principal, server, tool, q.Get("rule"), by)
		}
		ev := log.Info()
		if err != nil {
			ev = log.Error().Err(err)
		}
		ev.Str("rule", q.Get("rule")).Str("by", by.By).Str("reason", by.Reason).Msg("budget reset requested")
		budgetsAnswer(w, err, map[string]any{"result": "reset", "counter": held})
	})
}

// budgetsCall is the call a budgets request names.
func budgetsCall(q url.Values) (principal, server, tool string, err error) {
	principal, server, tool = q.Get("principal"), q.Get("server"), q.Get("tool")
	if principal == "" || server == "" || tool == "" {
		return "", "", "", errBudgetsCall
	}
	return principal, server, tool, nil
}

var errBudgetsCall = errors.New("principal, server and tool are required")

// budgetsAnswer writes v, or err as the admin listener's refusal, its
// result saying which.
func budgetsAnswer(w http.ResponseWriter, err error, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err == nil {
		_ = json.NewEncoder(w).Encode(v)
		return
	}
	result, status := "bad_request", http.StatusBadRequest
	switch {
	case errors.Is(err, store.ErrUnavailable):
		result, status = "store_unavailable", http.StatusServiceUnavailable
	case errors.Is(err, decide.ErrNoCounter):
		result, status = "not_found", http.StatusNotFound
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"result": result, "error": err.Error()})
}
