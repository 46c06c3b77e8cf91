//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/testbed"
)

// limitsPolicy is the seed's refund under the daily cap of the demo
// (USD 500 per agent per 24h) and lookups limited to 3 a minute; every
// agent under spiffe://acme/agent/ has its own counters.
const limitsPolicy = `tools:
  - server: billing
    tool: refund
    effect: money_move
    after: [lookup_order]
    constraints:
      - {name: usd_cap_250, expr: "args.amount <= 250"}
    budgets:
      - {name: daily_refunds, amount: args.amount, limit: 500, window: 24h}
  - server: billing
    tool: lookup_order
    effect: read
    rate_limits:
      - {name: lookups, limit: 3, window: 1m}
principals:
  - id_prefix: spiffe://acme/agent/
    grants:
      - {server: billing, tools: [lookup_order, refund]}
`

// sdkLimit is data.limit of a budget_exhausted or rate_limited denial.
type sdkLimit struct {
	Name              string  `json:"name"`
	Limit             float64 `json:"limit"`
	Used              float64 `json:"used"`
	Amount            float64 `json:"amount"`
	WindowSeconds     int64   `json:"window_seconds"`
	RetryAfterSeconds int64   `json:"retry_after_seconds"`
}

// Every SDK's planner reads a limit's denial: the reason, return_to later,
// and data.limit with the budget's name, limit, use, window and when to
// retry; a refund that would take the budget over is never started.
func TestSDKLimits(t *testing.T) {
	kinds := sdkKinds(t)
	s := startStackWith(t, func(o *testbed.StackOptions) { o.Policy = []byte(limitsPolicy) })
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			a := sdkMustConnect(t, kind, s.MCPURL(), "spiffe://acme/agent/limits-"+kind.name)
			a.list(t)
			a.mustAllow(t, "lookup_order", lookupA100)
			a.mustAllow(t, "refund", refundOf(200, "damaged"))
			a.mustAllow(t, "refund", refundOf(200, "damaged"))
			before := starts(t, s, "billing", "refund")
			l := a.limitOf(t, a.mustDeny(t, "refund", refundOf(200, "damaged"), "budget_exhausted"))
			if l.Name != "daily_refunds" || l.Limit != 500 || l.Used != 400 || l.Amount != 200 || l.WindowSeconds != 86400 || l.RetryAfterSeconds <= 0 {
				t.Errorf("[%s] data.limit %+v", kind.name, l)
			}
			if starts(t, s, "billing", "refund") != before {
				t.Fatalf("[%s] a refund over the budget started its handler", kind.name)
			}
			a.mustAllow(t, "refund", refundOf(100, "damaged"))

			a.mustAllow(t, "lookup_order", lookupA100)
			a.mustAllow(t, "lookup_order", lookupA100)
			l = a.limitOf(t, a.mustDeny(t, "lookup_order", lookupA100, "rate_limited"))
			if l.Name != "lookups" || l.Limit != 3 || l.Used != 3 || l.RetryAfterSeconds < 1 || l.RetryAfterSeconds > 61 {
				t.Errorf("[%s] data.limit %+v", kind.name, l)
			}
		})
	}
}

// limitOf is a denial's data.limit, which every limit's denial carries.
func (a *sdkAgent) limitOf(t *testing.T, d sdkDenial) sdkLimit {
	t.Helper()
	if d.ReturnTo != "later" || d.Limit == nil {
		t.Fatalf("[%s] denial %+v, want return_to later and data.limit", a.kind.name, d)
	}
	var l sdkLimit
	if err := json.Unmarshal(d.Limit, &l); err != nil {
		t.Fatalf("[%s] data.limit %s: %v", a.kind.name, d.Limit, err)
	}
	return l
}

// Under denials.status http_error a limit's denial is Envoy's 429 with
// Retry-After, the seconds data.limit gives.
func TestLimitRetryAfter(t *testing.T) {
	s := startStackWith(t, func(o *testbed.StackOptions) {
		o.Policy, o.Denials = []byte(limitsPolicy), "{status: http_error}"
	})
	h := map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "lookup_order"}
	const agent = "spiffe://acme/agent/retry-after"
	deliveryRawListAs(t, s, agent)
	var resp *http.Response
	var body []byte
	for i := range 4 {
		resp, body = postWith(t, s, agent, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"lookup_order","arguments":{"order_id":"A-100"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`, i+2), h)
		if i < 3 && resp.StatusCode != http.StatusOK {
			t.Fatalf("lookup %d: %d %s", i+1, resp.StatusCode, body)
		}
	}
	var e struct {
		Error struct {
			Data struct {
				Reason string   `json:"reason"`
				Limit  sdkLimit `json:"limit"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	after, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || e.Error.Data.Reason != "rate_limited" || err != nil || int64(after) != e.Error.Data.Limit.RetryAfterSeconds || after < 1 {
		t.Fatalf("the fourth lookup: %d, Retry-After %q, data %+v, want 429 with the seconds data.limit gives\n%s",
			resp.StatusCode, resp.Header.Get("Retry-After"), e.Error.Data, body)
	}
}

// deliveryRawListAs lists billing's tools as agent, in 2026-07-28.
func deliveryRawListAs(t *testing.T, s *testbed.Stack, agent string) {
	t.Helper()
	resp, body := postWith(t, s, agent, `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`,
		map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(testbed.EpochHeader) == "" {
		t.Fatalf("tools/list: %d\n%s", resp.StatusCode, body)
	}
}

// With billing's release_on_error, a refund the server answers with a tool
// error (an order that does not exist) gives its USD 250 back through the
// response path, so two real refunds of 250 still fit the USD 500 budget;
// a third does not.
func TestReleaseOnError(t *testing.T) {
	s := startStackWith(t, func(o *testbed.StackOptions) {
		o.Policy, o.ReleaseOnError = []byte(limitsPolicy), true
	})
	const agent = "spiffe://acme/agent/release"
	deliveryRawListAs(t, s, agent)
	call := func(id int, tool, args string) (*http.Response, []byte) {
		return postWith(t, s, agent, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`, id, tool, args),
			map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": tool})
	}
	if resp, body := call(2, "lookup_order", `{"order_id":"A-100"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("lookup: %d %s", resp.StatusCode, body)
	}
	want := []struct {
		order, result string
	}{{"X-404", `"isError":true`}, {"A-100", "Refund rf_"}, {"A-100", "Refund rf_"}, {"A-100", "budget_exhausted"}}
	for i, w := range want {
		_, body := call(3+i, "refund", fmt.Sprintf(`{"order_id":%q,"amount":250,"reason_code":"damaged"}`, w.order))
		if !strings.Contains(string(body), w.result) {
			t.Fatalf("refund %d (%s): %s, want %s", i+1, w.order, body, w.result)
		}
	}
	if n := replicaMetric(t, s, 0, "capsnap_limit_decisions_total", "result", "released"); n != 1 {
		t.Errorf("capsnap_limit_decisions_total{result=released} = %v, want 1", n)
	}
}
