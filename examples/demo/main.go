// Command demo walks a newcomer through capsnap's decisions: it starts two
// MCP servers (billing and payments), capsnap and a real Envoy on the demo
// ports, then acts as agents on the official MCP Go SDK and prints each
// decision and why, through the seed's worked refund example, its policy
// (a USD 250 cap, a reason allowlist, refund only after lookup), its drift
// denial, a daily cap that spans calls, and a person approving one exact
// refund.
package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/examples/billing"
	"github.com/capsnap/capsnap/pincheck"
	"github.com/capsnap/capsnap/testbed"
)

//go:embed policy.yaml
var policy []byte

const (
	supportAgent  = "spiffe://acme/agent/support-refund"
	readonlyAgent = "spiffe://acme/agent/support-readonly"
)

var refundA100 = map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"}

// dailyCap is the seed's "daily cap": USD 500 of refunds per agent per
// 24h, summed over its calls, on top of the USD 250 a call.
const dailyCap = `    budgets:
      - name: daily_refunds
        amount: args.amount
        limit: 500
        window: 24h
`

// approvalRule holds a payments refund over USD 100 (10000 cents) for the
// on-call's approval of its exact arguments.
const approvalRule = `    approval:
      when: "int(args.amount) > 10000"
      approvers: ["group:billing-oncall"]
      ttl: 10m
`

// withApproval is p with approvalRule on payments' refund.
func withApproval(p []byte) ([]byte, error) {
	const after = "        message: \"refunds are capped at USD 250 (25000 cents) per call\"\n"
	if strings.Count(string(p), after) != 1 {
		return nil, errors.New("policy.yaml: payments' refund rule is not where the approval goes")
	}
	return []byte(strings.Replace(string(p), after, after+approvalRule, 1)), nil
}

// withDailyCap is p with dailyCap on billing's refund.
func withDailyCap(p []byte) ([]byte, error) {
	const after = "        message: \"reason_code must be duplicate_charge, not_received or damaged\"\n"
	if strings.Count(string(p), after) != 1 {
		return nil, errors.New("policy.yaml: billing's refund rule is not where the daily cap goes")
	}
	return []byte(strings.Replace(string(p), after, after+dailyCap, 1)), nil
}

// changeControl puts billing under change control: a title-only edit is
// accepted by the policy, any other change waits for the on-call.
const changeControl = `changes:
  - server: billing
    accept: "change.kinds.all(k, k == 'title_changed')"
    reviewers: ["group:billing-oncall"]
`

func main() {
	capsnapBin := flag.String("capsnap", "bin/capsnap", "capsnap binary")
	billingBin := flag.String("billing", "bin/billing", "billing example server binary")
	verbose := flag.Bool("v", false, "also print every process's output")
	flag.Parse()
	if err := run(*capsnapBin, *billingBin, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(capsnapBin, billingBin string, verbose bool) error {
	envoyBin, err := testbed.FindEnvoy()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "capsnap-demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var tee io.Writer
	if verbose {
		tee = os.Stderr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	step("Starting two MCP servers (billing, payments), capsnap and Envoy on loopback")
	s, err := testbed.StartStack(ctx, testbed.StackOptions{
		Capsnap: capsnapBin, Billing: billingBin, Envoy: envoyBin,
		Ports: testbed.DemoPorts, Dir: dir, Policy: policy, Tee: tee,
		// capsnap sends every allowed call an envelope, under a grant
		// signed once per snapshot and tool; the servers check it against
		// capsnap's JWKS and their grant key before a handler starts.
		Envelope: true, Grants: true,
		// The approval page and API on the demo's port 9003, its approvers
		// development tokens: the on-call is testbed.ApproverToken.
		Approvals: true,
	})
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Printf("  Envoy:   %s\n  MCP URL: %s (Envoy -> capsnap ext_authz -> billing)\n", s.EnvoyVersion, s.MCPURL())

	step("The support agent discovers tools: tools/list is the authorize boundary")
	agent := testbed.NewAgent(supportAgent)
	cs, err := agent.Connect(ctx, s.MCPURL(), "")
	if err != nil {
		return err
	}
	defer cs.Close()
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		return fmt.Errorf("tools/list: %w", err)
	}
	for _, t := range list.Tools {
		fmt.Printf("  tool %-13s %s\n", t.Name, firstLine(t.Description))
	}
	epoch := agent.Epoch()
	fmt.Printf("  capsnap minted snapshot %s (x-capsnap-epoch) pinning refund at %s\n", epoch, short(digest("baseline")))

	step("The policy says refund only after lookup_order: a premature refund")
	call(ctx, cs, "refund", refundA100)

	step("Turn 1: look order A-100 up, then refund it, USD 40, duplicate_charge")
	call(ctx, cs, "lookup_order", map[string]any{"order_id": "A-100"})
	call(ctx, cs, "refund", refundA100)
	fmt.Printf("  billing's refund handler has started %d time(s)\n", starts(ctx, s))

	step("The policy caps a refund at USD 250 and allowlists reason codes")
	call(ctx, cs, "refund", map[string]any{"order_id": "A-100", "amount": 250.01, "reason_code": "duplicate_charge"})
	call(ctx, cs, "refund", map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "goodwill"})

	step("The operator puts billing under change control: a changed tool waits for the on-call (a tightening)")
	controlled := append(append([]byte{}, policy...), changeControl...)
	if err := s.ReloadPolicy(ctx, controlled); err != nil {
		return err
	}
	fmt.Printf("  %s", strings.ReplaceAll(changeControl, "\n", "\n  "))
	fmt.Println()

	step("Attack mid-turn: billing redeploys refund with skip_fraud_check; list_changed fires")
	if err := s.Redeploy(ctx, "billing", billing.SkipFraudCheck); err != nil {
		return err
	}
	if err := s.WaitCatalog(ctx, "billing", "refund", digest(billing.SkipFraudCheck)); err != nil {
		return err
	}
	fmt.Printf("  capsnap's own view of refund is now %s\n", short(digest(billing.SkipFraudCheck)))

	step("A pending identical proposal that still carries " + epoch)
	agent.Send(testbed.EpochHeader, epoch)
	before := starts(ctx, s)
	call(ctx, cs, "refund", refundA100)
	fmt.Printf("  handler starts: %d -> %d (the handler never ran)\n", before, starts(ctx, s))

	step("The agent returns to planning: it lists tools again; the changed refund is not the new contract")
	agent.Send(testbed.EpochHeader, "")
	if err := listed(ctx, cs, agent); err != nil {
		return err
	}
	call(ctx, cs, "lookup_order", map[string]any{"order_id": "A-100"})
	reviewID := call(ctx, cs, "refund", refundA100)
	if reviewID == "" {
		return errors.New("the changed refund was not held for review")
	}

	step("The on-call reviews the change: what the server added, word by word")
	approver := &approval.Client{URL: s.ApprovalsURL(), Token: testbed.ApproverToken}
	if err := showReview(ctx, approver, reviewID); err != nil {
		return err
	}
	if _, err := approver.Decide(ctx, reviewID, false, "skip_fraud_check steers refunds past the fraud check"); err != nil {
		return fmt.Errorf("reject: %w", err)
	}
	fmt.Printf("  %s rejects it on the review page's API\n", testbed.OnCall)
	if err := listed(ctx, cs, agent); err != nil {
		return err
	}
	call(ctx, cs, "refund", refundA100)

	step("Billing rolls the change back: refund is back at the definition that was approved")
	if err := s.Redeploy(ctx, "billing", billing.Baseline); err != nil {
		return err
	}
	if err := s.WaitCatalog(ctx, "billing", "refund", digest(billing.Baseline)); err != nil {
		return err
	}
	if err := listed(ctx, cs, agent); err != nil {
		return err
	}
	call(ctx, cs, "lookup_order", map[string]any{"order_id": "A-100"})
	call(ctx, cs, "refund", refundA100)

	step("Billing retitles lookup_order: a title-only change the policy accepts without a person")
	if err := s.Redeploy(ctx, "billing", billing.LookupRetitled); err != nil {
		return err
	}
	if err := s.WaitCatalog(ctx, "billing", "lookup_order", digestOf(billing.LookupRetitled, "lookup_order")); err != nil {
		return err
	}
	if err := listed(ctx, cs, agent); err != nil {
		return err
	}
	call(ctx, cs, "lookup_order", map[string]any{"order_id": "A-100"})

	step("The operator adds a daily cap: USD 500 of refunds per agent per 24h (a tightening, so a reload takes it)")
	capped, err := withDailyCap(controlled)
	if err != nil {
		return err
	}
	if err := s.ReloadPolicy(ctx, capped); err != nil {
		return err
	}
	call(ctx, cs, "refund", refundA100)
	if _, err := cs.ListTools(ctx, nil); err != nil {
		return fmt.Errorf("tools/list: %w", err)
	}
	fmt.Printf("  the agent lists again: snapshot %s, under the capped policy\n", agent.Epoch())
	call(ctx, cs, "lookup_order", map[string]any{"order_id": "A-100"})
	for range 3 {
		call(ctx, cs, "refund", map[string]any{"order_id": "A-100", "amount": 200, "reason_code": "damaged"})
	}

	step("Refunds over USD 100 on payments now wait for a person: the operator adds an approval rule (a tightening)")
	held, err := withApproval(capped)
	if err != nil {
		return err
	}
	if err := s.ReloadPolicy(ctx, held); err != nil {
		return err
	}
	pay, err := agent.Connect(ctx, s.RouteURL("payments"), "")
	if err != nil {
		return err
	}
	defer pay.Close()
	if _, err := pay.ListTools(ctx, nil); err != nil {
		return fmt.Errorf("payments tools/list: %w", err)
	}
	refund150 := map[string]any{"order_id": "A-100", "amount": "15000", "destination_account": "acct-1"}
	id := call(ctx, pay, "refund", refund150)
	if id == "" {
		return errors.New("the refund of USD 150 was not held for approval")
	}
	if _, err := approver.Decide(ctx, id, true, "demo: order A-100 checked"); err != nil {
		return fmt.Errorf("approve: %w", err)
	}
	fmt.Printf("  %s approves request %s on the approval page's API\n", testbed.OnCall, id)
	call(ctx, pay, "refund", refund150)
	call(ctx, pay, "refund", refund150)

	step("Another agent replays the support agent's snapshot")
	thief := testbed.NewAgent(readonlyAgent)
	thief.Send(testbed.EpochHeader, agent.Epoch())
	ro, err := thief.Connect(ctx, s.MCPURL(), "")
	if err != nil {
		return err
	}
	defer ro.Close()
	call(ctx, ro, "refund", refundA100)

	step("The read-only agent, under its own snapshot, tries to refund")
	thief.Send(testbed.EpochHeader, "")
	if _, err := ro.ListTools(ctx, nil); err != nil {
		return fmt.Errorf("tools/list: %w", err)
	}
	call(ctx, ro, "refund", refundA100)

	step("A tool the server does not serve")
	call(ctx, cs, "delete_all_orders", map[string]any{})

	step(`A body with "name" twice (a parser differential)`)
	rawPost(ctx, s, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"lookup_order","name":"refund","arguments":{}}}`)

	step("A request straight to billing, bypassing Envoy, with forged x-capsnap-* headers")
	before = starts(ctx, s)
	if err := bypass(ctx, s, digest("baseline"), epoch); err != nil {
		return err
	}
	fmt.Printf("  handler starts: %d -> %d (only a call capsnap signed runs)\n", before, starts(ctx, s))

	step(fmt.Sprintf("Done: the refund handler ran %d time(s), each under a verified contract", starts(ctx, s)))
	return nil
}

func step(s string) { fmt.Printf("\n== %s\n", s) }

// forge writes the x-capsnap-* headers capsnap would, with no envelope: a
// pod that reaches the server without passing Envoy.
type forge struct{ digest, epoch string }

func (f forge) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("x-capsnap-schema-digest", f.digest)
	r.Header.Set("x-capsnap-epoch", f.epoch)
	r.Header.Set("x-capsnap-principal", supportAgent)
	return http.DefaultTransport.RoundTrip(r)
}

func bypass(ctx context.Context, s *testbed.Stack, digest, epoch string) error {
	client := mcp.NewClient(&mcp.Implementation{Name: "bypass", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: s.ServerURL("billing") + "/mcp", HTTPClient: &http.Client{Transport: forge{digest, epoch}},
	}, nil)
	if err != nil {
		return fmt.Errorf("connect to billing directly: %w", err)
	}
	defer cs.Close()
	fmt.Printf("  POST %s/mcp tools/call refund, x-capsnap-schema-digest %s\n", s.ServerURL("billing"), short(digest))
	call(ctx, cs, "refund", refundA100)
	return nil
}

func digest(variant string) string { return digestOf(variant, "refund") }

func digestOf(variant, tool string) string {
	for _, d := range billing.Definitions(variant) {
		if d.Name == tool {
			dg, _ := pincheck.Digest(d)
			return dg
		}
	}
	return ""
}

func short(digest string) string {
	if len(digest) > len("sha256:")+12 {
		return digest[:len("sha256:")+12] + "…"
	}
	return digest
}

func starts(ctx context.Context, s *testbed.Stack) int {
	st, err := s.Stats(ctx)
	if err != nil {
		return -1
	}
	return st.HandlerStarts["refund"]
}

// call calls tool and prints the decision; for a call held for approval
// it returns the request's id.
func call(ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) string {
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err == nil {
		fmt.Printf("  ALLOW  tools/call %s\n", tool)
		return ""
	}
	var werr *jsonrpc.Error
	if !errors.As(err, &werr) {
		fmt.Printf("  ERROR  tools/call %s: %v\n", tool, err)
		return ""
	}
	var data struct {
		Reason         string   `json:"reason"`
		Drift          bool     `json:"capability_drift"`
		ReturnTo       string   `json:"return_to"`
		Detail         string   `json:"detail"`
		SnapshotDigest string   `json:"snapshot_digest"`
		LiveDigest     string   `json:"live_digest"`
		AllowedTools   []string `json:"allowed_tools"`
		Approval       *struct {
			ID  string `json:"id"`
			URL string `json:"url"`
		} `json:"approval"`
		Review *struct {
			ID  string `json:"id"`
			URL string `json:"url"`
		} `json:"review"`
		Change *struct {
			Kinds  []string `json:"kinds"`
			Fields []string `json:"fields"`
		} `json:"change"`
		Limit *struct {
			Name              string  `json:"name"`
			Limit             float64 `json:"limit"`
			Used              float64 `json:"used"`
			RetryAfterSeconds int64   `json:"retry_after_seconds"`
		} `json:"limit"`
	}
	_ = json.Unmarshal(werr.Data, &data)
	kind := ""
	if data.Drift {
		kind = "capability_drift "
	}
	fmt.Printf("  DENY   tools/call %s: %s%s, return to %s\n         %s\n", tool, kind, data.Reason, data.ReturnTo, data.Detail)
	// What the agent's code holds: the SDK's own JSON-RPC error, with
	// capsnap's code, message and data, and a session that still works.
	fmt.Printf("         the agent's SDK returns: JSON-RPC error %d %q, data.reason %q, data.return_to %q", werr.Code, werr.Message, data.Reason, data.ReturnTo)
	if len(data.AllowedTools) > 0 {
		fmt.Printf(", data.allowed_tools %v", data.AllowedTools)
	}
	if l := data.Limit; l != nil {
		fmt.Printf(", data.limit %s: %v of %v used, retry in %s", l.Name, l.Used, l.Limit, time.Duration(l.RetryAfterSeconds)*time.Second)
	}
	fmt.Println()
	if c := data.Change; c != nil {
		fmt.Printf("         data.change: %s, at %s\n", strings.Join(c.Kinds, ", "), strings.Join(c.Fields, ", "))
	}
	if a := data.Approval; a != nil {
		fmt.Printf("         a person approves it at %s\n", a.URL)
		return a.ID
	}
	if r := data.Review; r != nil {
		fmt.Printf("         the change is reviewed at %s\n", r.URL)
		return r.ID
	}
	return ""
}

// listed lists tools again and says what the agent got.
func listed(ctx context.Context, cs *mcp.ClientSession, agent *testbed.Agent) error {
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		return fmt.Errorf("tools/list: %w", err)
	}
	var names []string
	for _, t := range list.Tools {
		names = append(names, t.Name)
	}
	fmt.Printf("  tools/list: snapshot %s, delivered %s\n", agent.Epoch(), strings.Join(names, ", "))
	return nil
}

// showReview prints what the reviewer of a change sees: the kinds of
// change, and the words the description gained and lost.
func showReview(ctx context.Context, c *approval.Client, id string) error {
	r, err := c.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("review %s: %w", id, err)
	}
	if r.Change == nil {
		return fmt.Errorf("request %s is no review of a change", id)
	}
	var diff struct {
		Changes []struct {
			Kind  string `json:"kind"`
			Field string `json:"field"`
			Words []struct {
				Op   string `json:"op"`
				Text string `json:"text"`
			} `json:"words"`
		} `json:"changes"`
	}
	if err := json.Unmarshal(r.Change.Diff, &diff); err != nil {
		return fmt.Errorf("review %s: %w", id, err)
	}
	fmt.Printf("  %s on %s, granted to %s\n", r.Binding.Tool, r.Binding.Server, strings.Join(r.Change.Granted, ", "))
	for _, c := range diff.Changes {
		fmt.Printf("  %-20s %s\n", c.Kind, c.Field)
		for _, w := range c.Words {
			if w.Op != "=" {
				fmt.Printf("      %s %s\n", w.Op, w.Text)
			}
		}
	}
	return nil
}

func rawPost(ctx context.Context, s *testbed.Stack, body string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.MCPURL(), strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := testbed.HTTPClient(supportAgent).Do(req)
	if err != nil {
		fmt.Printf("  ERROR  %v\n", err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Printf("  DENY   HTTP %d, x-capsnap-reason: %s\n         %s\n", resp.StatusCode, resp.Header.Get("x-capsnap-reason"), b)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
