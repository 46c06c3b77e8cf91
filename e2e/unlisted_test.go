//go:build e2e

package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/testbed"
)

// scriptPolicy grants every script principal billing's and payments'
// tools, with a cap that holds calls made without listing too.
const scriptPolicy = `
tools:
  - server: billing
    tool: refund
    effect: money_move
    constraints:
      - {name: usd_cap_250, expr: "args.amount <= 250"}
  - {server: billing, tool: lookup_order, effect: read}
  - {server: payments, tool: refund, effect: money_move}
  - {server: payments, tool: lookup_order, effect: read}
principals:
  - id_prefix: spiffe://acme/agent/script-
    grants:
      - {server: billing, tools: [refund, lookup_order]}
      - {server: payments, tools: [refund, lookup_order]}
`

// A caller that never lists, on every SDK's client: on billing, whose
// operator opted in (calls_without_listing), a granted call runs, held to
// the live definition and the policy's terms, and is audited
// without_snapshot; a call over the cap, or by a principal with no grant,
// is denied as ever; on payments, which did not opt in, the same call is
// no_snapshot.
func TestSDKCallsWithoutListing(t *testing.T) {
	s := startStackWith(t, func(o *testbed.StackOptions) {
		o.Policy, o.CallsWithoutListing = []byte(scriptPolicy), true
	})
	for _, kind := range sdkKinds(t) {
		t.Run(kind.name, func(t *testing.T) {
			// A principal of its own: no other client's listing lends it
			// a snapshot.
			principal := "spiffe://acme/agent/script-" + kind.name
			script := sdkMustConnect(t, kind, s.MCPURL(), principal)
			if text := script.mustAllow(t, "lookup_order", lookupA100); !strings.Contains(text, "A-100") {
				t.Fatalf("[%s] lookup_order without listing answered %q", kind.name, text)
			}
			if !auditedWithoutSnapshot(t, s.Capsnap.Output(), principal, "lookup_order") {
				t.Fatalf("[%s] lookup_order without listing is not audited without_snapshot", kind.name)
			}
			// Some SDK clients list on their own before calling a tool
			// with an outputSchema (refund), to validate its result: the
			// cap holds either way.
			script.mustDeny(t, "refund", map[string]any{"order_id": "A-100", "amount": 400, "reason_code": "damaged"}, "constraint_violation")

			stranger := sdkMustConnect(t, kind, s.MCPURL(), "spiffe://acme/agent/stranger-"+kind.name)
			stranger.mustDeny(t, "lookup_order", lookupA100, "tool_not_granted")

			other := sdkMustConnect(t, kind, s.RouteURL("payments"), principal)
			other.mustDeny(t, "lookup_order", lookupA100, "no_snapshot")
		})
	}
}

// auditedWithoutSnapshot reports whether the trail holds an allowed call
// of tool by principal audited without_snapshot.
func auditedWithoutSnapshot(t *testing.T, trail, principal, tool string) bool {
	t.Helper()
	for _, line := range strings.Split(trail, "\n") {
		var ev struct {
			Log, Decision, Principal, Tool string
			MCPMethod                      string `json:"mcp_method"`
			WithoutSnapshot                bool   `json:"without_snapshot"`
		}
		if json.Unmarshal([]byte(line), &ev) != nil || ev.Log != "audit" {
			continue
		}
		if ev.MCPMethod == "tools/call" && ev.Principal == principal && ev.Tool == tool && ev.Decision == "allow" && ev.WithoutSnapshot {
			return true
		}
	}
	return false
}
