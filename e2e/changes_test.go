//go:build e2e

package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/examples/billing"
	"github.com/capsnap/capsnap/testbed"
)

// changePolicy puts billing under change control: a title-only change is
// accepted, any other waits for billing's on-call.
const changePolicy = `tools:
  - {server: billing, tool: refund, effect: money_move}
  - {server: billing, tool: lookup_order, effect: read}
principals:
  - id_prefix: spiffe://acme/agent/
    grants:
      - {server: billing, tools: [lookup_order, refund]}
changes:
  - server: billing
    accept: "change.kinds.all(k, k == 'title_changed')"
    reviewers: ["group:billing-oncall"]
`

// review decides review id as the stack's on-call, through the approval
// API of the replica at url.
func review(t *testing.T, url, id string, approve bool, reason string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := &approval.Client{URL: url, Token: testbed.ApproverToken}
	if _, err := c.Decide(ctx, id, approve, reason); err != nil {
		t.Fatalf("decide review %s: %v", id, err)
	}
}

// The seed's rug pull under change control, with every SDK's client. The
// redeploy with skip_fraud_check drifts the planned refund, saying what
// changed; listing again, refund is withheld and its call denied
// tool_under_review with where it is reviewed, while lookup_order works;
// once the on-call approves, refund is back at its new definition. A
// further edit the on-call rejects keeps refund out, saying why; the
// server returning to the approved definition brings it back.
func TestSDKChangeControl(t *testing.T) {
	kinds := sdkKinds(t)
	s := startStackWith(t, func(o *testbed.StackOptions) { o.Policy, o.Approvals = []byte(changePolicy), true })
	agents := make([]*sdkAgent, len(kinds))
	for i, kind := range kinds {
		agents[i] = sdkMustConnect(t, kind, s.MCPURL(), "spiffe://acme/agent/change-"+kind.name)
		if tools := agents[i].list(t); !slices.Contains(tools, "refund") {
			t.Fatalf("[%s] first sight listed %v", kind.name, tools)
		}
		agents[i].mustAllow(t, "refund", refundOf(40, "damaged"))
	}

	redeploy(t, s, "billing", billing.SkipFraudCheck)
	reviewID := ""
	for _, a := range agents {
		d := a.mustDeny(t, "refund", refundOf(40, "damaged"), "schema_drift")
		if d.Change == nil || !slices.Contains(d.Change.Kinds, "property_added") || !slices.Contains(d.Change.Fields, "inputSchema.properties.skip_fraud_check") {
			t.Fatalf("[%s] the drift says %+v of what changed", a.kind.name, d.Change)
		}
		if tools := a.list(t); slices.Contains(tools, "refund") || !slices.Contains(tools, "lookup_order") {
			t.Fatalf("[%s] under review, listed %v", a.kind.name, tools)
		}
		d = a.mustDeny(t, "refund", refundOf(40, "damaged"), "tool_under_review")
		if d.ReturnTo != "later" || d.Review == nil || d.Review.URL != s.ApprovalsURL()+"/approvals/"+d.Review.ID {
			t.Fatalf("[%s] denial %+v", a.kind.name, d)
		}
		if reviewID != "" && d.Review.ID != reviewID {
			t.Fatalf("[%s] another review: %s, not %s", a.kind.name, d.Review.ID, reviewID)
		}
		reviewID = d.Review.ID
		a.mustAllow(t, "lookup_order", lookupA100)
	}
	review(t, s.ApprovalsURL(), reviewID, true, "reviewed with billing")
	withSkip := map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "damaged", "skip_fraud_check": false}
	for _, a := range agents {
		if tools := a.list(t); !slices.Contains(tools, "refund") {
			t.Fatalf("[%s] approved, listed %v", a.kind.name, tools)
		}
		a.mustAllow(t, "refund", withSkip)
	}

	redeploy(t, s, "billing", billing.DescriptionEdit)
	for _, a := range agents {
		a.list(t)
		reviewID = a.mustDeny(t, "refund", refundOf(40, "damaged"), "tool_under_review").Review.ID
	}
	review(t, s.ApprovalsURL(), reviewID, false, "steers the model to full refunds")
	for _, a := range agents {
		if tools := a.list(t); slices.Contains(tools, "refund") {
			t.Fatalf("[%s] rejected, listed %v", a.kind.name, tools)
		}
		if d := a.mustDeny(t, "refund", refundOf(40, "damaged"), "tool_change_rejected"); !strings.Contains(d.Detail, "steers the model to full refunds") {
			t.Fatalf("[%s] the rejection says %q", a.kind.name, d.Detail)
		}
	}

	redeploy(t, s, "billing", billing.SkipFraudCheck)
	for _, a := range agents {
		if tools := a.list(t); !slices.Contains(tools, "refund") {
			t.Fatalf("[%s] reverted to the approved definition, listed %v", a.kind.name, tools)
		}
		a.mustAllow(t, "refund", withSkip)
	}
}

// Two replicas on one Redis, every Check to replica 0 and every response
// to replica 1: a change approved through replica 0's approval API is in
// force when replica 1 delivers the next listing, and calls through
// replica 0 are held to it, with no reload anywhere.
func TestChangeApprovedAcrossReplicas(t *testing.T) {
	s, _ := replicaStack(t, func(o *testbed.StackOptions) {
		o.Policy, o.Approvals, o.CrossReplicas = []byte(changePolicy), true, true
	})
	kind := sdkKinds(t)[0]
	a := sdkMustConnect(t, kind, s.MCPURL(), "spiffe://acme/agent/change-replicas")
	a.list(t)
	redeployBoth(t, s, billing.SkipFraudCheck)
	a.list(t)
	d := a.mustDeny(t, "refund", refundOf(40, "damaged"), "tool_under_review")
	review(t, s.ApprovalsURL(), d.Review.ID, true, "reviewed")
	if tools := a.list(t); !slices.Contains(tools, "refund") {
		t.Fatalf("approved on replica 0, replica 1 listed %v", tools)
	}
	a.mustAllow(t, "refund", map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "damaged", "skip_fraud_check": false})
}
