//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"testing"
)

// Mcp-Param-{Name} (SEP-2243) end to end, on the Python SDK's server with
// lookup_order's order_id marked x-mcp-header "Order"
// (verifiers/python/example/server.py --mirror-order-id): the Python SDK's
// client (mcp 2.3.0) and the Go SDK's (v1.8.0) mirror the argument in
// Mcp-Param-Order, and capsnap,
// which requires the header at 2026-07-28, lets the call run. A request
// whose Mcp-Param-* headers disagree with its arguments, or lack one, or
// name an argument the tool does not mark, is answered -32020, HTTP 400,
// for its id, and its handler never starts.
func TestRev2026ParamHeaders(t *testing.T) {
	var python rev2026Server
	for _, srv := range rev2026Servers(t) {
		if srv.name == "python" {
			python = srv
		}
	}
	s := rev2026Stack(t, rev2026Server{"python", true, func(id, addr, jwks string) (string, []string) {
		bin, args := python.command(id, addr, jwks)
		return bin, append(args, "--mirror-order-id")
	}})

	// The SDK clients that speak 2026-07-28 and mirror the argument: the
	// Python mcp.Client and the Go SDK's client (TypeScript 1.32.2 does not
	// speak the revision).
	var kinds []sdkKind
	for _, kind := range sdkKinds(t) {
		if kind.name == "python-client" || kind.name == "go" {
			kinds = append(kinds, kind)
		}
	}
	for i, kind := range kinds {
		a := sdkMustConnect(t, kind, s.MCPURL(), supportAgent)
		a.list(t)
		a.mustAllow(t, "lookup_order", lookupA100)
		if got := starts(t, s, "billing", "lookup_order"); got != i+1 {
			t.Fatalf("[%s] lookup_order's handler ran %d times, want %d", kind.name, got, i+1)
		}
	}

	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`
	call := func(id int) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"lookup_order","arguments":{"order_id":"A-100"},`+meta+`}}`, id)
	}
	headers := func(kv ...string) map[string]string {
		h := map[string]string{"Mcp-Protocol-Version": rev2026, "Mcp-Method": "tools/call", "Mcp-Name": "lookup_order"}
		for i := 0; i < len(kv); i += 2 {
			h[kv[i]] = kv[i+1]
		}
		return h
	}
	for i, tc := range []struct {
		name    string
		headers map[string]string
		allowed bool
	}{
		{"mcp-param disagrees", headers("Mcp-Param-Order", "A-999"), false},
		{"mcp-param missing", headers(), false},
		{"mcp-param for an unmarked argument", headers("Mcp-Param-Order", "A-100", "Mcp-Param-Region", "eu"), false},
		{"mcp-param invalid base64", headers("Mcp-Param-Order", "=?base64?QS0xMDA?="), false},
		{"mcp-param in another case, base64-encoded", headers("mcp-param-ORDER", "=?base64?QS0xMDA=?="), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := 30 + i
			resp, body := postWith(t, s, supportAgent, call(id), tc.headers)
			if tc.allowed {
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("HTTP %d %s, want the call to run", resp.StatusCode, body)
				}
				return
			}
			rev2026MustRefuse(t, resp, body, fmt.Sprint(id), -32020, "header_mismatch")
		})
	}
	if got := starts(t, s, "billing", "lookup_order"); got != len(kinds)+1 {
		t.Fatalf("lookup_order's handler ran %d times, want %d (the SDKs' calls and the agreeing raw one)", got, len(kinds)+1)
	}
	if st := serverStats(t, s, "billing"); len(st.Refusals) != 0 {
		t.Fatalf("the server refused calls capsnap allowed: %v", st.Refusals)
	}
}
