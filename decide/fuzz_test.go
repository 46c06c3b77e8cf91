package decide

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	segjson "github.com/segmentio/encoding/json"
)

// sdkToolCalls returns the tools/call requests the official Go SDK server
// would read from body: per message, jsonrpc.DecodeMessage, then params
// bound to mcp.CallToolParamsRaw by the SDK's own decoder
// (segmentio/encoding/json, case-sensitive fields). A message the SDK
// refuses runs nothing and is left out.
func sdkToolCalls(body []byte) []mcp.CallToolParamsRaw {
	elements := []json.RawMessage{body}
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) > 0 && t[0] == '[' {
		if err := json.Unmarshal(body, &elements); err != nil {
			return nil
		}
	}
	var out []mcp.CallToolParamsRaw
	for _, el := range elements {
		msg, err := jsonrpc.DecodeMessage(el)
		if err != nil {
			continue
		}
		req, ok := msg.(*jsonrpc.Request)
		if !ok || req.Method != "tools/call" || !req.IsCall() {
			continue
		}
		var p mcp.CallToolParamsRaw
		dec := segjson.NewDecoder(bytes.NewReader(req.Params))
		dec.DontMatchCaseInsensitiveStructFields()
		if dec.Decode(&p) != nil {
			continue
		}
		out = append(out, p)
	}
	return out
}

// FuzzCheck runs a whole Check against a seeded catalog and a snapshot the
// support agent minted, over fuzzed body bytes, content-type and
// MCP-Protocol-Version. Check never panics and never returns a gRPC error;
// whenever it allows a request, the Go SDK server reads from the same body
// exactly the tools/call capsnap pinned (tool in x-capsnap-tool and the
// audit, arguments by the audit's arguments_digest), or none when capsnap
// pinned none.
func FuzzCheck(f *testing.F) {
	f.Add([]byte(callBody("lookup_order")), "application/json", "")
	f.Add([]byte(callBody("refund")), "application/json", "2025-11-25")
	f.Add([]byte(`[{"jsonrpc":"2.0","id":1,"method":"ping"},`+callBody("refund")+`]`), "application/json", "2025-03-26")
	f.Add([]byte(listBody), "application/json; charset=utf-8", "")

	fx := newFixture(f)
	fx.list(f, support, "billing", nil)
	f.Fuzz(func(t *testing.T, body []byte, contentType, version string) {
		c := checkCase{Name: "fuzz", Principal: support, Headers: map[string]string{"content-type": contentType}}
		if version != "" {
			c.Headers["mcp-protocol-version"] = version
		}
		req := c.request()
		req.Attributes.Request.Http.RawBody = body
		fx.audit.Reset()
		resp, err := fx.Check(context.Background(), req)
		if err != nil {
			t.Fatalf("Check returned a gRPC error: %v", err)
		}
		// Whatever the body, Envoy can decode the answer, and its
		// metadata says what the answer is.
		md := onTheWire(t, resp).GetDynamicMetadata().GetFields()
		want := "deny"
		if resp.GetOkResponse() != nil {
			want = "allow"
		}
		if got := md["decision"].GetStringValue(); got != want {
			t.Fatalf("the answer is %s, its metadata says %q: %v", want, got, md)
		}
		// What the request names reaches the access log bounded.
		for _, k := range []string{"mcp_method", "mcp_name", "tool"} {
			if v := md[k].GetStringValue(); len(v) > maxLogValue+len("…") {
				t.Fatalf("metadata %s is %d bytes, over the bound of %d", k, len(v), maxLogValue)
			}
		}
		ok := resp.GetOkResponse()
		if ok == nil {
			if resp.GetDeniedResponse() == nil {
				t.Fatalf("neither allowed nor denied: %v", resp)
			}
			return
		}
		var pinned string
		for _, h := range ok.Headers {
			if h.GetHeader().GetKey() == HeaderTool {
				pinned = h.GetHeader().GetValue()
			}
		}
		// The pins go once, in the upstream headers, which Envoy's
		// header_to_metadata copies into the metadata after ext_authz
		// (the tool as mcp_name too): an allowed call's metadata is its
		// decision and its method alone, and the request's id, which
		// ext_proc answers if it withholds the answer.
		if tool, ok := md["tool"]; ok {
			t.Fatalf("metadata repeats tool %q, which the upstream headers pin as %q", tool.GetStringValue(), pinned)
		}
		entries := 3
		if _, ok := md["jsonrpc_id"]; ok {
			entries = 4
		}
		if pinned != "" && (len(md) != entries || md["reason"].GetStringValue() != "ok" || md["mcp_method"].GetStringValue() != "tools/call") {
			t.Fatalf("an allowed call's metadata is %v, want decision, reason and mcp_method tools/call alone, and jsonrpc_id", md)
		}
		if id, ok := md["jsonrpc_id"]; ok && !json.Valid([]byte(id.GetStringValue())) {
			t.Fatalf("jsonrpc_id %q is not the request's JSON id", id.GetStringValue())
		}
		var audit struct {
			Decision string `json:"decision"`
			Tool     string `json:"tool"`
			ArgsSum  string `json:"arguments_digest"`
		}
		if err := json.Unmarshal(bytes.TrimSpace(fx.audit.Bytes()), &audit); err != nil {
			t.Fatalf("audit line %q: %v", fx.audit.Bytes(), err)
		}
		if audit.Decision != "allow" || audit.Tool != pinned {
			t.Fatalf("audit says %s tool %q, upstream headers pin %q", audit.Decision, audit.Tool, pinned)
		}
		calls := sdkToolCalls(body)
		if pinned == "" {
			if len(calls) > 0 {
				t.Fatalf("allowed with no tool pinned, but the Go SDK reads tools/call %q from %q", calls[0].Name, body)
			}
			return
		}
		if len(calls) != 1 {
			t.Fatalf("capsnap pinned %q, the Go SDK reads %d tools/call from %q", pinned, len(calls), body)
		}
		if calls[0].Name != pinned {
			t.Fatalf("capsnap pinned %q, the Go SDK runs %q, from %q", pinned, calls[0].Name, body)
		}
		var sum string
		if len(calls[0].Arguments) > 0 {
			s := sha256.Sum256(calls[0].Arguments)
			sum = "sha256:" + hex.EncodeToString(s[:])
		}
		if sum != audit.ArgsSum {
			t.Fatalf("capsnap verified arguments %s, the Go SDK binds %s (%s), from %q", audit.ArgsSum, sum, calls[0].Arguments, body)
		}
	})
}
