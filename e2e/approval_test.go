//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/testbed"
)

// approvalPolicy holds a refund over USD 100 for billing's on-call; every
// agent under spiffe://acme/agent/ may refund.
const approvalPolicy = `tools:
  - server: billing
    tool: refund
    effect: money_move
    approval:
      when: "args.amount > 100"
      approvers: ["group:billing-oncall"]
      ttl: 10m
  - {server: billing, tool: lookup_order, effect: read}
principals:
  - id_prefix: spiffe://acme/agent/
    grants:
      - {server: billing, tools: [lookup_order, refund]}
`

// approve approves request id as the stack's on-call approver, through the
// approval API, and fails unless it was approved.
func approve(t *testing.T, s *testbed.Stack, token, id string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := &approval.Client{URL: s.ApprovalsURL(), Token: token}
	_, err := c.Decide(ctx, id, true, "checked the order")
	return err
}

// Every SDK's planner gets approval_required with where to approve; once
// the on-call approves, the identical refund runs once; again, or with
// another amount, it needs another approval. An approver outside the rule
// cannot approve. Once the on-call denies it, the identical call is denied
// approval_denied, with the reason.
func TestSDKApproval(t *testing.T) {
	kinds := sdkKinds(t)
	s := startStackWith(t, func(o *testbed.StackOptions) { o.Policy, o.Approvals = []byte(approvalPolicy), true })
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			a := sdkMustConnect(t, kind, s.MCPURL(), "spiffe://acme/agent/approval-"+kind.name)
			a.list(t)
			a.mustAllow(t, "refund", refundOf(40, "damaged"))
			before := starts(t, s, "billing", "refund")
			d := a.mustDeny(t, "refund", refundOf(150, "damaged"), "approval_required")
			if d.ReturnTo != "approval" || d.Approval == nil || d.Approval.URL != s.ApprovalsURL()+"/approvals/"+d.Approval.ID {
				t.Fatalf("[%s] denial %+v", kind.name, d)
			}
			if err := approve(t, s, testbed.OutsiderToken, d.Approval.ID); err == nil {
				t.Fatalf("[%s] an approver outside the rule approved", kind.name)
			}
			if err := approve(t, s, testbed.ApproverToken, d.Approval.ID); err != nil {
				t.Fatalf("[%s] approve: %v", kind.name, err)
			}
			a.mustDeny(t, "refund", refundOf(151, "damaged"), "approval_required")
			a.mustAllow(t, "refund", refundOf(150, "damaged"))
			if got := starts(t, s, "billing", "refund") - before; got != 1 {
				t.Fatalf("[%s] refund's handler ran %d times, want once", kind.name, got)
			}
			// Asked again, and denied: the agent learns "no", and why,
			// and pages no one again.
			again := a.mustDeny(t, "refund", refundOf(150, "damaged"), "approval_required")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := (&approval.Client{URL: s.ApprovalsURL(), Token: testbed.ApproverToken}).Decide(ctx, again.Approval.ID, false, "A-100 was refunded already"); err != nil {
				t.Fatalf("[%s] deny: %v", kind.name, err)
			}
			denied := a.mustDeny(t, "refund", refundOf(150, "damaged"), "approval_denied")
			if denied.ReturnTo != "none" || denied.Approval == nil || denied.Approval.ID != again.Approval.ID || !strings.Contains(denied.Detail, "A-100 was refunded already") {
				t.Fatalf("[%s] the denial reached the agent as %+v", kind.name, denied)
			}
		})
	}
}

// A 2025-11-25 client that declared URL-mode elicitation gets MCP's
// URLElicitationRequiredError, with the approval page as the elicitation's
// URL: TypeScript's client throws its UrlElicitationRequiredError; Python's
// raises an MCPError with code -32042, which its
// UrlElicitationRequiredError.from_error reads. Approved there, the retry
// runs.
func TestSDKApprovalAsURLElicitation(t *testing.T) {
	s := startStackWith(t, func(o *testbed.StackOptions) { o.Policy, o.Approvals = []byte(approvalPolicy), true })
	// At 2026-07-28 (python-client) the same is an InputRequiredResult:
	// TestSDKApprovalAsInputRequired.
	want := map[string]string{"typescript": "UrlElicitationRequiredError", "python": "mcp.shared.exceptions.MCPError"}
	for _, kind := range sdkKinds(t) {
		class, ok := want[kind.name]
		if !ok {
			continue
		}
		t.Run(kind.name, func(t *testing.T) {
			a, st := sdkConnectWith(t, kind, sdkReq{URL: s.MCPURL(), ElicitationURL: true}, "spiffe://acme/agent/elicit-"+kind.name)
			if !st.OK {
				t.Fatalf("[%s] connect: %s", kind.name, st.summary())
			}
			a.list(t)
			st = a.call(t, "refund", refundOf(150, "damaged"))
			e := st.Error.mcpErr()
			if st.OK || e == nil || e.Class != class || e.Code == nil || *e.Code != -32042 {
				t.Fatalf("[%s] refund: %s, want %s with code -32042", kind.name, st.summary(), class)
			}
			var data struct {
				Elicitations []struct {
					Mode          string `json:"mode"`
					ElicitationID string `json:"elicitationId"`
					URL           string `json:"url"`
				} `json:"elicitations"`
			}
			if err := json.Unmarshal(e.Data, &data); err != nil || len(data.Elicitations) != 1 {
				t.Fatalf("[%s] data %s: %v", kind.name, e.Data, err)
			}
			if strings.HasPrefix(kind.name, "python") && (e.URLElicitationsError != "" || !strings.Contains(string(e.URLElicitations), data.Elicitations[0].URL)) {
				t.Fatalf("[%s] UrlElicitationRequiredError.from_error: %s %s", kind.name, e.URLElicitations, e.URLElicitationsError)
			}
			el := data.Elicitations[0]
			if el.Mode != "url" || !strings.HasPrefix(el.URL, s.ApprovalsURL()+"/approvals/") || !strings.HasSuffix(el.URL, el.ElicitationID) {
				t.Fatalf("[%s] elicitation %+v", kind.name, el)
			}
			if err := approve(t, s, testbed.ApproverToken, el.ElicitationID); err != nil {
				t.Fatalf("[%s] approve: %v", kind.name, err)
			}
			a.mustAllow(t, "refund", refundOf(150, "damaged"))
		})
	}
}

// A 2026-07-28 agent on the Go or Python SDK completes an approval with no
// capsnap-specific code: its held refund comes back as an
// InputRequiredResult, the SDK hands the URL elicitation to the
// application's elicitation handler (here the person approves on the page
// and the handler accepts), the SDK retries, and the refund runs once. A
// second identical call needs a new approval; one the on-call denies
// reaches the agent as approval_denied, with the reason.
func TestSDKApprovalAsInputRequired(t *testing.T) {
	s := startStackWith(t, func(o *testbed.StackOptions) { o.Policy, o.Approvals = []byte(approvalPolicy), true })
	for _, kind := range sdkKinds(t) {
		// The clients that speak 2026-07-28: Go's by default, Python's
		// mcp.Client; TypeScript's (1.32.2) does not.
		if kind.name == "go" || kind.name == "python-client" {
			t.Run(kind.name, func(t *testing.T) { inputRequired(t, s, kind) })
		}
	}
}

func inputRequired(t *testing.T, s *testbed.Stack, kind sdkKind) {
	approver := &sdkApprover{URL: s.ApprovalsURL(), Token: testbed.ApproverToken}
	a, st := sdkConnectWith(t, kind, sdkReq{URL: s.MCPURL(), ElicitationURL: true, ElicitationApprove: approver}, "spiffe://acme/agent/input-required-"+kind.name)
	if !st.OK || st.ProtocolVersion != "2026-07-28" {
		t.Fatalf("connect: %s", st.summary())
	}
	a.list(t)
	before := starts(t, s, "billing", "refund")
	st = a.call(t, "refund", refundOf(150, "damaged"))
	if !st.OK || len(st.Elicited) != 1 || st.Elicited[0].Mode != "url" || !strings.HasPrefix(st.Elicited[0].URL, s.ApprovalsURL()+"/approvals/") || st.Elicited[0].Approved != 200 {
		t.Fatalf("the held refund: %s, elicited %+v", st.summary(), st.Elicited)
	}
	if got := starts(t, s, "billing", "refund") - before; got != 1 {
		t.Fatalf("refund's handler ran %d times, want once", got)
	}
	// The wire: the held call answered 200 with a result, then the retry.
	calls := 0
	for _, h := range st.HTTP {
		if h.Method == "tools/call" {
			calls++
		}
	}
	if calls != 2 {
		t.Fatalf("%d tools/call requests, want the call and its retry: %s", calls, st.summary())
	}

	// Denied this time: the handler is asked, declines (no approver for
	// it), and the denial comes with the reason on the next call.
	a2, st := sdkConnectWith(t, kind, sdkReq{URL: s.MCPURL(), ElicitationURL: true}, "spiffe://acme/agent/input-required-denied-"+kind.name)
	if !st.OK {
		t.Fatalf("connect: %s", st.summary())
	}
	a2.list(t)
	st = a2.call(t, "refund", refundOf(160, "damaged"))
	if len(st.Elicited) != 1 {
		t.Fatalf("the held refund: %s, elicited %+v", st.summary(), st.Elicited)
	}
	id := strings.TrimPrefix(st.Elicited[0].URL, s.ApprovalsURL()+"/approvals/")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := (&approval.Client{URL: s.ApprovalsURL(), Token: testbed.ApproverToken}).Decide(ctx, id, false, "not this order"); err != nil {
		t.Fatal(err)
	}
	denied := a2.mustDeny(t, "refund", refundOf(160, "damaged"), "approval_denied")
	if !strings.Contains(denied.Detail, "not this order") {
		t.Fatalf("the denial reached the agent as %+v", denied)
	}
}

// The approved retry reaches a server on the Python SDK (its MCPServer,
// which refuses any requestState it did not seal, and which capsnap
// therefore sends none) and runs there once; the Go SDK's server is the
// stack's billing (TestSDKApprovalAsInputRequired). The TypeScript SDK's
// server (1.32.2) does not speak 2026-07-28, so no InputRequiredResult
// arises on its sessions.
func TestInputRequiredReachesThePythonServer(t *testing.T) {
	var python verifierServer
	for _, srv := range verifierServers(t) {
		if srv.name == "python" {
			python = srv
		}
	}
	s := startStackWith(t, func(o *testbed.StackOptions) {
		o.Policy, o.Approvals, o.Envelope = []byte(approvalPolicy), true, true
		jwks := fmt.Sprintf("http://127.0.0.1:%d/.well-known/jwks.json", o.Ports.Admin)
		o.ServerCommand = func(id, addr string) (string, []string, []string) {
			bin, args := python.command(id, addr, jwks, "")
			return bin, args, nil
		}
	})
	for _, kind := range sdkKinds(t) {
		if kind.name == "python-client" {
			inputRequired(t, s, kind)
		}
	}
	if st := serverStats(t, s, "billing"); len(st.Refusals) != 0 {
		t.Fatalf("the Python server refused calls capsnap allowed: %v", st.Refusals)
	}
}
