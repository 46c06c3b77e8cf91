//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/examples/billing"
	"github.com/capsnap/capsnap/pincheck"
	"github.com/capsnap/capsnap/testbed"
)

// twoReplicas is the stack's Envoy configuration with billing's cluster
// balanced, round robin, over two replicas: the billing process and the
// payments process (which the test redeploys to billing's next version).
func twoReplicas(t *testing.T, p testbed.Ports) []byte {
	t.Helper()
	cfg := string(testbed.EnvoyConfig(p))
	one := fmt.Sprintf("        - endpoint:\n            address:\n              socket_address: {address: 127.0.0.1, port_value: %d}\n", p.Billing)
	two := one + fmt.Sprintf("        - endpoint:\n            address:\n              socket_address: {address: 127.0.0.1, port_value: %d}\n", p.Payments)
	if strings.Count(cfg, one) != 1 {
		t.Fatalf("envoy config: billing's endpoint not found once")
	}
	return []byte(strings.Replace(cfg, one, two, 1))
}

// A rolling deploy: billing runs two versions behind one Service, so an
// agent's tools/list is answered by either while capsnap's own view
// watches one. Whatever the agent was delivered is what is pinned: a
// definition capsnap's view cannot confirm is never delivered as callable,
// and a call planned against it is denied, never allowed.
func TestRollingDeploy(t *testing.T) {
	s := startStackWith(t, func(o *testbed.StackOptions) { o.EnvoyYAML = twoReplicas(t, o.Ports) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The second replica serves the next version: refund with the seed's
	// skip_fraud_check. capsnap's view of billing is the first replica's.
	if err := s.Redeploy(ctx, "payments", billing.SkipFraudCheck); err != nil {
		t.Fatal(err)
	}
	confirmed := digestOf(t, billing.Baseline, "refund")
	unconfirmed := digestOf(t, billing.SkipFraudCheck, "refund")

	// 2026-07-28 is stateless: each request may reach either replica.
	c := connect(t, s, "billing", supportAgent, "2026-07-28")
	seen := map[string]int{}
	for i := 0; i < 16 && (seen["confirmed"] == 0 || seen["withheld"] == 0); i++ {
		// A listing and a call are two requests: one more every other
		// turn (whatever its outcome) shifts the rotation so that
		// listings reach both replicas.
		if i%2 == 1 {
			_, _ = c.CallTool(ctx, &mcp.CallToolParams{Name: "lookup_order", Arguments: map[string]any{"order_id": "A-100"}})
		}
		res, err := c.ListTools(ctx, nil)
		if err != nil {
			t.Fatalf("tools/list: %v", err)
		}
		delivered := ""
		for _, tool := range res.Tools {
			if tool.Name == "refund" {
				if delivered, err = pincheck.Digest(tool); err != nil {
					t.Fatal(err)
				}
			}
		}
		reason := c.call(t, "refund", refundA100)
		switch delivered {
		case confirmed:
			seen["confirmed"]++
			// Allowed; billing's own handler-start check refuses it if
			// the call itself lands on the other version.
			if reason != "" && reason != "handler_drift" {
				t.Errorf("listing %d: refund delivered at the confirmed %s, then %q", i, confirmed, reason)
			}
		case "":
			seen["withheld"]++
			if reason != "no_snapshot" {
				t.Errorf("listing %d: refund withheld from the agent, yet its call ended %q, want capsnap's no_snapshot", i, reason)
			}
		case unconfirmed:
			seen["unconfirmed"]++
			t.Errorf("listing %d: the agent was delivered refund at %s, which capsnap's live view (%s) never confirmed; its call ended %q (capsnap must deny it)",
				i, unconfirmed, confirmed, reason)
		default:
			t.Fatalf("listing %d: refund delivered at %s, served by neither replica", i, delivered)
		}
	}
	t.Logf("listings: %v", seen)
	if seen["confirmed"] == 0 || (seen["withheld"] == 0 && seen["unconfirmed"] == 0) {
		t.Fatalf("round robin did not reach both replicas: %v", seen)
	}
}
