//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/examples/billing"
	"github.com/capsnap/capsnap/pincheck"
	"github.com/capsnap/capsnap/testbed"
)

// The seed's worked example: refund A-100, USD 40, duplicate_charge.
var refundA100 = map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"}

// swapArgs fit the schema_swap contract: amount in cents, to an account.
var swapArgs = map[string]any{"order_id": "A-100", "amount": "4000", "destination_account": "acct-9"}

// digestOf is the schema digest of tool in a billing variant, as the server
// itself would compute it.
func digestOf(t *testing.T, variant, tool string) string {
	t.Helper()
	for _, d := range billing.Definitions(variant) {
		if d.Name == tool {
			dg, err := pincheck.Digest(d)
			if err != nil {
				t.Fatal(err)
			}
			return dg
		}
	}
	t.Fatalf("variant %s has no tool %s", variant, tool)
	return ""
}

// session is one agent's MCP session through Envoy.
type session struct {
	*mcp.ClientSession
	agent *testbed.Agent
}

func connect(t *testing.T, s *testbed.Stack, server, principal, version string) session {
	t.Helper()
	a := testbed.NewAgent(principal)
	cs, err := a.Connect(context.Background(), s.RouteURL(server), version)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	// The SDK falls back to an older version silently; a test of a
	// version must run at that version.
	if got := cs.InitializeResult().ProtocolVersion; version != "" && got != version {
		t.Fatalf("negotiated protocol version %s, want %s", got, version)
	}
	return session{cs, a}
}

// list lists tools and returns the epoch capsnap minted.
func (c session) list(t *testing.T) string {
	t.Helper()
	if _, err := c.ListTools(context.Background(), nil); err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	e := c.agent.Epoch()
	if !strings.HasPrefix(e, "ep_") {
		t.Fatalf("tools/list returned epoch %q", e)
	}
	return e
}

// call calls tool and returns capsnap's denial reason, or "" if allowed.
func (c session) call(t *testing.T, tool string, args map[string]any) string {
	t.Helper()
	res, err := c.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err == nil {
		if res.IsError {
			t.Fatalf("%s: tool error: %v", tool, res.Content)
		}
		return ""
	}
	var werr *jsonrpc.Error
	if !errors.As(err, &werr) {
		t.Fatalf("%s: %v is not a JSON-RPC error", tool, err)
	}
	return denialReason(t, err)
}

func starts(t *testing.T, s *testbed.Stack, server, tool string) int {
	t.Helper()
	st, err := s.ServerStats(context.Background(), server)
	if err != nil {
		t.Fatal(err)
	}
	return st.HandlerStarts[tool]
}

// redeploy redeploys a billing server as variant, and waits until
// capsnap's view has it.
func redeploy(t *testing.T, s *testbed.Stack, server, variant string) {
	t.Helper()
	redeployTo(t, s, server, variant)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	// capsnap learns of it from list_changed, on its own connection.
	if err := s.WaitCatalog(ctx, server, "refund", digestOf(t, variant, "refund")); err != nil {
		t.Fatal(err)
	}
}

// redeployTo redeploys server id as variant (POST /admin/variant, which
// the billing server and the SDKs' servers of e2e/rev2026_test.go serve).
func redeployTo(t *testing.T, s *testbed.Stack, id, variant string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := s.Redeploy(ctx, id, variant); err != nil {
		t.Fatal(err)
	}
}

func TestWorkedExample(t *testing.T) {
	s := startStack(t)
	c := connect(t, s, "billing", supportAgent, "")
	c.list(t)
	before := starts(t, s, "billing", "refund")
	if r := c.call(t, "refund", refundA100); r != "" {
		t.Fatalf("refund denied: %s", r)
	}
	if got := starts(t, s, "billing", "refund") - before; got != 1 {
		t.Fatalf("refund handler ran %d times, want once", got)
	}
}

// The seed's negative tests: the server redeploys between plan and call.
func TestRedeployDrift(t *testing.T) {
	s := startStack(t)
	for _, variant := range []string{billing.SkipFraudCheck, billing.DescriptionEdit, billing.SchemaSwap} {
		t.Run(variant, func(t *testing.T) {
			redeploy(t, s, "billing", billing.Baseline)
			c := connect(t, s, "billing", supportAgent, "2025-11-25")
			epoch := c.list(t)
			redeploy(t, s, "billing", variant)

			// A pending call that still carries the old epoch.
			c.agent.Send(testbed.EpochHeader, epoch)
			before := starts(t, s, "billing", "refund")
			if r := c.call(t, "refund", refundA100); r != "schema_drift" {
				t.Fatalf("call under the old epoch: %q, want schema_drift", r)
			}
			if starts(t, s, "billing", "refund") != before {
				t.Fatal("a drift-denied call started its handler")
			}

			// Rediscover: a new epoch over the new contract.
			c.agent.Send(testbed.EpochHeader, "")
			next := c.list(t)
			if next == epoch {
				t.Fatal("rediscovery reused the stale epoch")
			}
			args := refundA100
			if variant == billing.SchemaSwap {
				args = swapArgs
			}
			if r := c.call(t, "refund", args); r != "" {
				t.Fatalf("call under the new epoch: %q", r)
			}
			if starts(t, s, "billing", "refund") != before+1 {
				t.Fatal("the allowed call did not run exactly once")
			}
		})
	}
}

// A drift denial carries x-capability-drift, as Envoy sends it, and (the
// default denials.status) a 200 whose JSON-RPC error every SDK reads.
func TestDriftHeader(t *testing.T) {
	s := startStack(t)
	c := connect(t, s, "billing", supportAgent, "2026-07-28")
	epoch := c.list(t)
	redeploy(t, s, "billing", billing.SkipFraudCheck)
	req, _ := http.NewRequest(http.MethodPost, s.MCPURL(), strings.NewReader(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"refund","arguments":{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", "refund")
	req.Header.Set(testbed.EpochHeader, epoch)
	resp, err := testbed.HTTPClient(supportAgent).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("x-capability-drift") != "schema_drift" || resp.Header.Get("x-capsnap-reason") != "schema_drift" {
		t.Fatalf("got %s, x-capability-drift %q", resp.Status, resp.Header.Get("x-capability-drift"))
	}
	var msg struct {
		ID    int `json:"id"`
		Error struct {
			Code int                     `json:"code"`
			Data struct{ Reason string } `json:"data"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&msg); err != nil || msg.ID != 5 || msg.Error.Code != -31000 || msg.Error.Data.Reason != "schema_drift" {
		t.Fatalf("body: %+v, %v", msg, err)
	}
}

func TestReplayByAnotherPrincipal(t *testing.T) {
	s := startStack(t)
	owner := connect(t, s, "billing", supportAgent, "")
	epoch := owner.list(t)
	thief := connect(t, s, "billing", readonlyAgent, "")
	thief.agent.Send(testbed.EpochHeader, epoch)
	before := starts(t, s, "billing", "refund")
	if r := thief.call(t, "refund", refundA100); r != "principal_mismatch" {
		t.Fatalf("replayed snapshot: %q, want principal_mismatch", r)
	}
	if starts(t, s, "billing", "refund") != before {
		t.Fatal("a replayed call started its handler")
	}
}

// billing and payments both serve "refund", with different contracts; each
// call is held to its own server's digest, and the handler-start check on
// each server agrees.
func TestSameToolNameOnTwoServers(t *testing.T) {
	s := startStack(t)
	b := connect(t, s, "billing", supportAgent, "")
	p := connect(t, s, "payments", supportAgent, "")
	b.list(t)
	p.list(t)
	if r := b.call(t, "refund", refundA100); r != "" {
		t.Fatalf("billing refund: %q", r)
	}
	if r := p.call(t, "refund", swapArgs); r != "" {
		t.Fatalf("payments refund: %q", r)
	}
	if starts(t, s, "billing", "refund") != 1 || starts(t, s, "payments", "refund") != 1 {
		t.Fatal("each server's refund should have run once")
	}
	// One server's redeploy drifts only its own refund.
	redeploy(t, s, "payments", billing.SkipFraudCheck)
	if r := p.call(t, "refund", refundA100); r != "schema_drift" {
		t.Fatalf("payments after its redeploy: %q", r)
	}
	if r := b.call(t, "refund", refundA100); r != "" {
		t.Fatalf("billing after payments redeployed: %q", r)
	}
}

func TestPolicyReload(t *testing.T) {
	base, err := os.ReadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, from, to, want string
	}{
		{"rules changed", "{server: billing, tools: [refund, lookup_order]}", `{server: billing, tools: ["*"]}`, "policy_drift"},
		{"effect class raised", "{server: billing, tool: refund, effect: money_move}", "{server: billing, tool: refund, effect: admin}", "effect_escalation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startStack(t)
			c := connect(t, s, "billing", supportAgent, "")
			c.list(t)
			changed := strings.Replace(string(base), tt.from, tt.to, 1)
			if changed == string(base) {
				t.Fatalf("policy edit %q did not apply", tt.from)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := s.ReloadPolicy(ctx, []byte(changed)); err != nil {
				t.Fatal(err)
			}
			if r := c.call(t, "refund", refundA100); r != tt.want {
				t.Fatalf("after reload: %q, want %s", r, tt.want)
			}
			// lookup_order's rules did not change: its snapshot still holds.
			if tt.want == "effect_escalation" {
				if r := c.call(t, "lookup_order", map[string]any{"order_id": "A-100"}); r != "" {
					t.Fatalf("lookup_order after an unrelated reload: %q", r)
				}
			}
			if starts(t, s, "billing", "refund") != 0 {
				t.Fatal("a denied refund ran")
			}
		})
	}
}

func TestSnapshotExpired(t *testing.T) {
	s := startStackWith(t, func(o *testbed.StackOptions) { o.SnapshotTTL = time.Second })
	c := connect(t, s, "billing", supportAgent, "")
	c.list(t)
	time.Sleep(1100 * time.Millisecond) // the TTL under test
	if r := c.call(t, "refund", refundA100); r != "snapshot_expired" {
		t.Fatalf("after the TTL: %q, want snapshot_expired", r)
	}
	c.list(t)
	if r := c.call(t, "refund", refundA100); r != "" {
		t.Fatalf("after relisting: %q", r)
	}
}

func TestCatalogSourceDown(t *testing.T) {
	s := startStack(t)
	c := connect(t, s, "billing", supportAgent, "")
	c.list(t)
	if err := s.Billing.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := s.WaitCatalogError(ctx, "billing"); err != nil {
		t.Fatal(err)
	}
	if r := c.call(t, "refund", refundA100); r != "catalog_unavailable" {
		t.Fatalf("with the server down: %q, want catalog_unavailable", r)
	}
}

// The server changes between capsnap's allow and the handler's start:
// capsnap's view (the listing) is still the old contract, so capsnap
// allows, and the handler-start check refuses before any side effect.
func TestHandlerStartCheck(t *testing.T) {
	s := startStack(t)
	c := connect(t, s, "billing", supportAgent, "2025-11-25")
	c.list(t)
	if err := s.RollOutHandlers(context.Background(), "billing", billing.SkipFraudCheck); err != nil {
		t.Fatal(err)
	}
	before := starts(t, s, "billing", "refund")
	_, err := c.CallTool(context.Background(), &mcp.CallToolParams{Name: "refund", Arguments: refundA100})
	var werr *jsonrpc.Error
	if !errors.As(err, &werr) || werr.Code != pincheck.CodeRefused || !strings.Contains(string(werr.Data), `"reason":"`+pincheck.Reason+`"`) {
		t.Fatalf("call after a handler-only rollout: %v, want a %s refusal", err, pincheck.Reason)
	}
	if starts(t, s, "billing", "refund") != before {
		t.Fatal("the refused call started its handler")
	}
	// capsnap allowed it: its audit line says so, with the pinned digest
	// the handler refused.
	allowed := false
	for _, line := range strings.Split(s.Capsnap.Output(), "\n") {
		if strings.Contains(line, `"decision":"allow"`) && strings.Contains(line, `"mcp_method":"tools/call"`) && strings.Contains(line, `"tool":"refund"`) {
			allowed = true
		}
	}
	if !allowed {
		t.Fatal("capsnap has no audit line allowing the refund call")
	}
}
