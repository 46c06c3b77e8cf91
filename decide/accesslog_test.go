package decide

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/envoy"
)

// demoCopies are the header_to_metadata rules of envoy/demo.yaml: the
// metadata key each x-capsnap-* header capsnap sets on an allowed request
// is copied into, under the ext_authz filter's namespace.
func demoCopies(t *testing.T) map[string][]string {
	t.Helper()
	var doc any
	if err := yaml.Unmarshal(envoy.Demo, &doc); err != nil {
		t.Fatal(err)
	}
	var rules []any
	var walk func(any)
	walk = func(n any) {
		switch n := n.(type) {
		case map[string]any:
			if n["name"] == "envoy.filters.http.header_to_metadata" {
				tc, _ := n["typed_config"].(map[string]any)
				rules, _ = tc["request_rules"].([]any)
				return
			}
			for _, v := range n {
				walk(v)
			}
		case []any:
			for _, v := range n {
				walk(v)
			}
		}
	}
	walk(doc)
	copies := map[string][]string{}
	for _, r := range rules {
		r, _ := r.(map[string]any)
		h, _ := r["header"].(string)
		p, _ := r["on_header_present"].(map[string]any)
		if ns, key := p["metadata_namespace"], p["key"]; h != "" && ns == "envoy.filters.http.ext_authz" {
			copies[h] = append(copies[h], key.(string))
		}
	}
	if len(copies) == 0 {
		t.Fatal("envoy/demo.yaml has no header_to_metadata rules")
	}
	return copies
}

// accessLogged is what envoy/demo.yaml's access log reads of a Check's
// answer under the ext_authz namespace: capsnap's dynamic metadata, and on
// an allowed request what header_to_metadata copies from the headers
// capsnap set for the upstream (the client's own x-capsnap-* headers are
// removed).
func accessLogged(t *testing.T, copies map[string][]string, resp *authv3.CheckResponse) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range onTheWire(t, resp).GetDynamicMetadata().GetFields() {
		out[k] = v.GetStringValue()
	}
	for _, h := range resp.GetOkResponse().GetHeaders() {
		for _, k := range copies[h.GetHeader().GetKey()] {
			out[k] = h.GetHeader().GetValue()
		}
	}
	return out
}

// mcpRequest is a request as a client of protocol version ver sends it:
// 2025-03-26 names no version; 2025-06-18 and 2025-11-25 send
// MCP-Protocol-Version and, past initialize, Mcp-Session-Id; 2026-07-28
// has no session, names its version in params._meta too, and mirrors the
// method and name in Mcp-Method and Mcp-Name.
func mcpRequest(t *testing.T, ver, method string, params map[string]any) checkCase {
	t.Helper()
	h := map[string]string{}
	switch ver {
	case "2025-06-18", "2025-11-25":
		h["mcp-protocol-version"] = ver
		if method != "initialize" {
			h["mcp-session-id"] = "S-" + ver
		}
	case "2026-07-28":
		h["mcp-protocol-version"] = ver
		h["mcp-method"] = method
		if params == nil {
			params = map[string]any{}
		}
		params["_meta"] = map[string]any{"io.modelcontextprotocol/protocolVersion": ver}
		switch method {
		case "tools/call", "prompts/get":
			h["mcp-name"] = params["name"].(string)
		case "resources/read":
			h["mcp-name"] = params["uri"].(string)
		}
	}
	msg := map[string]any{"jsonrpc": "2.0", "method": method}
	if !strings.HasPrefix(method, "notifications/") {
		msg["id"] = 7
	}
	if params != nil {
		msg["params"] = params
	}
	body, err := json.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	return checkCase{Principal: support, Headers: h, Body: string(body)}
}

// Every decision, allowed or denied, tells Envoy's access log the MCP
// method of the request and what it names (the tool, prompt or resource,
// as 2026-07-28's Mcp-Name mirrors it), read from the body in every
// protocol version: not from the Mcp-Method and Mcp-Name headers, which
// clients before 2026-07-28 do not send and which a client may forge.
func TestAccessLogNamesTheRequest(t *testing.T) {
	copies := demoCopies(t)
	someone := "spiffe://acme/agent/someone-else"
	type row struct {
		name string
		c    checkCase
		// list, if set, lists tools first as c's principal, minting the
		// snapshot a call is verified against.
		list     bool
		decision string
		// method and mcpName are the logged mcp_method and mcp_name; ""
		// is absent.
		method, mcpName string
	}
	var tests []row
	for _, ver := range []string{"2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"} {
		req := func(method string, params map[string]any) checkCase { return mcpRequest(t, ver, method, params) }
		as := func(c checkCase, principal string) checkCase { c.Principal = principal; return c }
		connect := "initialize"
		if ver == "2026-07-28" {
			connect = "server/discover"
		}
		tests = append(tests,
			row{ver + " " + connect, req(connect, map[string]any{"protocolVersion": ver}), false, "allow", connect, ""},
			row{ver + " notification", req("notifications/cancelled", map[string]any{"requestId": 1}), false, "allow", "notifications/cancelled", ""},
			row{ver + " tools/list", req("tools/list", nil), false, "allow", "tools/list", ""},
			row{ver + " tools/call allowed", req("tools/call", map[string]any{"name": "lookup_order", "arguments": map[string]any{"order_id": "A-1"}}), true, "allow", "tools/call", "lookup_order"},
			row{ver + " tools/call not granted", as(req("tools/call", map[string]any{"name": "refund", "arguments": map[string]any{}}), someone), true, "deny", "tools/call", "refund"},
			row{ver + " tools/call without a snapshot", req("tools/call", map[string]any{"name": "refund", "arguments": map[string]any{}}), false, "deny", "tools/call", "refund"},
			row{ver + " prompts/get", req("prompts/get", map[string]any{"name": "greet"}), false, "allow", "prompts/get", "greet"},
			row{ver + " resources/read", req("resources/read", map[string]any{"uri": "file:///orders/A-1.json"}), false, "allow", "resources/read", "file:///orders/A-1.json"},
			row{ver + " resources/subscribe names nothing", req("resources/subscribe", map[string]any{"uri": "file:///orders/A-1.json"}), false, "allow", "resources/subscribe", ""},
			row{ver + " without a principal", as(req("tools/call", map[string]any{"name": "refund", "arguments": map[string]any{}}), ""), false, "deny", "tools/call", "refund"},
		)
	}
	with := func(c checkCase, kv ...string) checkCase {
		h := map[string]string{}
		for k, v := range c.Headers {
			h[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			h[kv[i]] = kv[i+1]
		}
		c.Headers = h
		return c
	}
	call2026 := mcpRequest(t, "2026-07-28", "tools/call", map[string]any{"name": "refund", "arguments": map[string]any{}})
	call1125 := mcpRequest(t, "2025-11-25", "tools/call", map[string]any{"name": "refund", "arguments": map[string]any{}})
	batch := func(msgs ...string) checkCase {
		return checkCase{Principal: support, Body: "[" + strings.Join(msgs, ",") + "]"}
	}
	const (
		initialized = `{"jsonrpc":"2.0","method":"notifications/initialized"}`
		ping        = `{"jsonrpc":"2.0","id":1,"method":"ping"}`
		greet       = `{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{"name":"greet"}}`
		lookupCall  = `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"lookup_order","arguments":{"order_id":"A-1"}}}`
	)
	// Cut at 255 bytes: byte 256 is within an é.
	long := "file:///x" + strings.Repeat("é", maxLogValue)
	tests = append(tests,
		// The headers a client sends are never what is logged: one that
		// disagrees with the body is refused, and the body is logged.
		row{"2026-07-28 Mcp-Name disagrees", with(call2026, "mcp-name", "lookup_order"), false, "deny", "tools/call", "refund"},
		row{"2026-07-28 Mcp-Method disagrees", with(call2026, "mcp-method", "tools/list"), false, "deny", "tools/call", "refund"},
		row{"2025-11-25 Mcp-Name disagrees", with(call1125, "mcp-name", "lookup_order"), false, "deny", "tools/call", "refund"},
		row{"forged x-capsnap-tool on a prompt", with(mcpRequest(t, "2025-11-25", "prompts/get", map[string]any{"name": "greet"}), HeaderTool, "refund"), false, "allow", "prompts/get", "greet"},
		row{"forged x-capsnap-tool on a call", with(mcpRequest(t, "2025-11-25", "tools/call", map[string]any{"name": "lookup_order", "arguments": map[string]any{"order_id": "A-1"}}), HeaderTool, "refund"), true, "allow", "tools/call", "lookup_order"},
		// A 2025-03-26 batch is named by the one tools/call or tools/list
		// it may carry, else by its first message.
		row{"batch with a call", batch(initialized, lookupCall), true, "allow", "tools/call", "lookup_order"},
		row{"batch of a ping and a prompt", batch(ping, greet), false, "allow", "ping", ""},
		row{"batch of a prompt and a ping", batch(greet, ping), false, "allow", "prompts/get", "greet"},
		row{"batch with two calls", batch(lookupCall, strings.Replace(lookupCall, `"id":3`, `"id":4`, 1)), true, "deny", "tools/call", "lookup_order"},
		row{"batch in 2025-11-25", with(batch(ping, lookupCall), "mcp-protocol-version", "2025-11-25"), false, "deny", "", ""},
		// No JSON-RPC message: the HTTP method.
		row{"GET stream", checkCase{Principal: support, Method: "GET", Headers: map[string]string{"mcp-protocol-version": "2025-11-25", "mcp-session-id": "S-1"}}, false, "allow", "GET", ""},
		row{"DELETE session", checkCase{Principal: support, Method: "DELETE", Headers: map[string]string{"mcp-protocol-version": "2025-11-25", "mcp-session-id": "S-1"}}, false, "allow", "DELETE", ""},
		row{"a client's answer to the server", checkCase{Principal: support, Body: `{"jsonrpc":"2.0","id":1,"result":{}}`}, false, "allow", "", ""},
		row{"unreadable body", checkCase{Principal: support, Body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund"`}, false, "deny", "", ""},
		// Bounded, valid UTF-8, one line.
		row{"long uri", mcpRequest(t, "2025-11-25", "resources/read", map[string]any{"uri": long}), false, "allow", "resources/read", "file:///x" + strings.Repeat("é", 123) + "…"},
		row{"prompt name with a newline", mcpRequest(t, "2025-11-25", "prompts/get", map[string]any{"name": "greet\n{\"decision\":\"allow\"}"}), false, "allow", "prompts/get", "greet\uFFFD{\"decision\":\"allow\"}"},
	)

	f := newFixture(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.list {
				f.listBefore(t, tt.c)
			}
			resp, err := f.Check(context.Background(), tt.c.request())
			if err != nil {
				t.Fatal(err)
			}
			got := accessLogged(t, copies, resp)
			if got["decision"] != tt.decision {
				t.Fatalf("decision %q (%v), want %s", got["decision"], got, tt.decision)
			}
			for k, want := range map[string]string{"mcp_method": tt.method, "mcp_name": tt.mcpName} {
				v, ok := got[k]
				switch {
				case want == "" && ok:
					t.Errorf("%s %q, want none", k, v)
				case want != "" && v != want:
					t.Errorf("%s %q, want %q", k, v, want)
				}
			}
		})
	}
}
