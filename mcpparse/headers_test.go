package mcpparse

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/deny"
)

// call2026 is a tools/call as a 2026-07-28 client sends it: the version in
// params._meta.
func call2026(name string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":` + name + `,"arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
}

// h2026 are the headers of a 2026-07-28 tools/call of refund, plus kv.
func h2026(kv ...string) map[string]string {
	return withJSON(append([]string{"mcp-protocol-version", "2026-07-28", "mcp-method", "tools/call", "mcp-name", "refund"}, kv...)...)
}

func TestHeaders(t *testing.T) {
	b64 := func(s string) string { return "=?base64?" + base64.StdEncoding.EncodeToString([]byte(s)) + "?=" }
	ping := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	tests := []struct {
		name    string
		body    string
		headers map[string]string
		reason  deny.Reason // empty: accepted
		detail  string
	}{
		// Entity headers.
		{"gzip", ping, withJSON("content-encoding", "gzip"), deny.UnsupportedEncoding, `content-encoding "gzip"`},
		{"two codings", ping, withJSON("content-encoding", "identity, gzip"), deny.UnsupportedEncoding, "uncompressed"},
		{"identity", ping, withJSON("content-encoding", "Identity"), "", ""},
		{"no content-type", ping, map[string]string{}, deny.UnsupportedMediaType, "no content-type"},
		{"text/plain", ping, map[string]string{"content-type": "text/plain"}, deny.UnsupportedMediaType, "not application/json"},
		{"json-seq", ping, map[string]string{"content-type": "application/json-seq"}, deny.UnsupportedMediaType, "not application/json"},
		{"two content-types joined", ping, map[string]string{"content-type": "application/json,text/plain"}, deny.UnsupportedMediaType, "not application/json"},
		{"charset utf-8", ping, map[string]string{"content-type": "application/json; charset=UTF-8"}, "", ""},
		{"upper-case media type", ping, map[string]string{"content-type": "Application/JSON"}, "", ""},
		{"charset utf-16", ping, map[string]string{"content-type": "application/json; charset=utf-16"}, deny.UnsupportedMediaType, "only the parameter charset=utf-8"},
		{"other parameter", ping, map[string]string{"content-type": "application/json; profile=x"}, deny.UnsupportedMediaType, "only the parameter charset=utf-8"},
		{"content-length agrees", ping, withJSON("content-length", "40"), "", ""},
		{"content-length longer than the body", ping, withJSON("content-length", "41"), deny.MalformedRequest, "content-length is 41 but Envoy delivered 40 bytes"},
		{"content-length not a number", ping, withJSON("content-length", "+40"), deny.MalformedRequest, "not a length"},
		{"partial body", ping, withJSON("x-envoy-auth-partial-body", "true"), deny.MalformedRequest, "truncated"},

		// MCP-Protocol-Version.
		{"unknown version", ping, withJSON("mcp-protocol-version", "2024-11-05"), deny.HeaderMismatch, `mcp-protocol-version "2024-11-05" is not a version capsnap speaks`},
		{"empty version", ping, withJSON("mcp-protocol-version", ""), deny.HeaderMismatch, "not a version capsnap speaks"},
		{"two versions joined", ping, withJSON("mcp-protocol-version", "2025-06-18,2025-06-18"), deny.HeaderMismatch, "not a version capsnap speaks"},
		{"header disagrees with initialize", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}`, withJSON("mcp-protocol-version", "2025-06-18"), deny.HeaderMismatch, `header "2025-06-18" disagrees with the body's protocol version "2025-11-25"`},
		{"header disagrees with _meta", call2026(`"refund"`), h2026("mcp-protocol-version", "2025-11-25"), deny.HeaderMismatch, "disagrees with the body's protocol version"},
		{"_meta 2026 without the header", call2026(`"refund"`), withJSON("mcp-method", "tools/call", "mcp-name", "refund"), deny.HeaderMismatch, "requires the mcp-protocol-version header"},

		// Mcp-Session-Id.
		{"session in 2025-06-18", ping, withJSON("mcp-protocol-version", "2025-06-18", "mcp-session-id", "SESS-1"), "", ""},
		{"session in 2026-07-28", call2026(`"refund"`), h2026("mcp-session-id", "SESS-1"), deny.HeaderMismatch, "stateless"},
		{"empty session", ping, withJSON("mcp-session-id", ""), deny.HeaderMismatch, "empty"},
		{"session with a space", ping, withJSON("mcp-session-id", "a b"), deny.HeaderMismatch, "outside visible ASCII"},
		{"two sessions joined", ping, withJSON("mcp-session-id", "a,b"), deny.HeaderMismatch, "comma"},
		{"session with non-ASCII", ping, withJSON("mcp-session-id", "sé"), deny.HeaderMismatch, "outside visible ASCII"},

		// Mcp-Method and Mcp-Name in 2026-07-28.
		{"2026 tools/call", call2026(`"refund"`), h2026(), "", ""},
		{"2026 without mcp-method", call2026(`"refund"`), withJSON("mcp-protocol-version", "2026-07-28", "mcp-name", "refund"), deny.HeaderMismatch, "requires the mcp-method header"},
		{"2026 mcp-method disagrees", call2026(`"refund"`), h2026("mcp-method", "tools/list"), deny.HeaderMismatch, `mcp-method "tools/list" disagrees with the body's method "tools/call"`},
		{"2026 mcp-method in another case", call2026(`"refund"`), h2026("mcp-method", "Tools/Call"), deny.HeaderMismatch, "disagrees"},
		{"2026 without mcp-name", call2026(`"refund"`), withJSON("mcp-protocol-version", "2026-07-28", "mcp-method", "tools/call"), deny.HeaderMismatch, "requires the mcp-name header for tools/call"},
		{"2026 mcp-name disagrees", call2026(`"refund"`), h2026("mcp-name", "lookup_order"), deny.HeaderMismatch, `mcp-name "lookup_order" disagrees with the body's params.name "refund"`},
		{"2026 mcp-name base64", call2026(`"refund"`), h2026("mcp-name", b64("refund")), "", ""},
		{"2026 non-ASCII name base64", call2026(`"tööl_unicode"`), h2026("mcp-name", b64("tööl_unicode")), "", ""},
		{"2026 non-ASCII name raw, as the Go SDK sends it", call2026(`"tööl_unicode"`), h2026("mcp-name", "tööl_unicode"), "", ""},
		{"2026 base64 of another name", call2026(`"refund"`), h2026("mcp-name", b64("lookup_order")), deny.HeaderMismatch, `mcp-name "lookup_order" disagrees`},
		{"2026 invalid base64", call2026(`"refund"`), h2026("mcp-name", "=?base64?!!!?="), deny.HeaderMismatch, "not valid =?base64?…?= encoding"},
		{"2026 name that looks encoded, sent raw", call2026(`"=?base64?cmVmdW5k?="`), h2026("mcp-name", "=?base64?cmVmdW5k?="), deny.HeaderMismatch, `mcp-name "refund" disagrees`},
		{"2026 name that looks encoded, sent encoded", call2026(`"=?base64?cmVmdW5k?="`), h2026("mcp-name", b64("=?base64?cmVmdW5k?=")), "", ""},
		{"2026 tools/list", `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`, withJSON("mcp-protocol-version", "2026-07-28", "mcp-method", "tools/list"), "", ""},
		{"2026 tools/list with a name", `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`, withJSON("mcp-protocol-version", "2026-07-28", "mcp-method", "tools/list", "mcp-name", "refund"), deny.HeaderMismatch, "has no string params.uri to mirror"},
		{"2026 resources/read", `{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"file:///a b"}}`, withJSON("mcp-protocol-version", "2026-07-28", "mcp-method", "resources/read", "mcp-name", b64("file:///a b")), "", ""},
		{"2026 resources/read uri disagrees", `{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"file:///a"}}`, withJSON("mcp-protocol-version", "2026-07-28", "mcp-method", "resources/read", "mcp-name", "file:///b"), deny.HeaderMismatch, "params.uri"},
		{"2026 prompts/get without mcp-name", `{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{"name":"greet"}}`, withJSON("mcp-protocol-version", "2026-07-28", "mcp-method", "prompts/get"), deny.HeaderMismatch, "requires the mcp-name header for prompts/get"},
		{"2026 prompts/get", `{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{"name":"greet"}}`, withJSON("mcp-protocol-version", "2026-07-28", "mcp-method", "prompts/get", "mcp-name", "greet"), "", ""},
		{"2026 notification without mcp-method", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`, withJSON("mcp-protocol-version", "2026-07-28"), "", ""},
		{"2026 notification with a disagreeing mcp-method", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`, withJSON("mcp-protocol-version", "2026-07-28", "mcp-method", "tools/call"), deny.HeaderMismatch, "disagrees"},

		// Mcp-Method and Mcp-Name before 2026-07-28: optional, never a hint.
		{"2025-11-25 without mirror headers", refund(refundArgs), withJSON("mcp-protocol-version", "2025-11-25"), "", ""},
		{"2025-11-25 agreeing mirror headers", refund(refundArgs), withJSON("mcp-protocol-version", "2025-11-25", "mcp-method", "tools/call", "mcp-name", "refund"), "", ""},
		{"2025-11-25 mcp-method disagrees", refund(refundArgs), withJSON("mcp-protocol-version", "2025-11-25", "mcp-method", "tools/list"), deny.HeaderMismatch, "disagrees"},
		{"2025-06-18 mcp-name disagrees", refund(refundArgs), withJSON("mcp-protocol-version", "2025-06-18", "mcp-name", "lookup_order"), deny.HeaderMismatch, "disagrees"},
		{"2025-03-26 mcp-name disagrees", refund(refundArgs), withJSON("mcp-name", "lookup_order"), deny.HeaderMismatch, "disagrees"},
		{"response with mcp-method", `{"jsonrpc":"2.0","id":1,"result":{}}`, withJSON("mcp-method", "tools/call"), deny.HeaderMismatch, "a response has no method"},
		{"batch with mcp-method", `[` + refund(refundArgs) + `]`, withJSON("mcp-method", "tools/call"), deny.HeaderMismatch, "cannot mirror a batch"},
		{"batch with mcp-name", `[` + refund(refundArgs) + `]`, withJSON("mcp-name", "refund"), deny.HeaderMismatch, "cannot mirror a batch"},

		// Mcp-Param-*: held to the arguments by CheckParamHeaders, and
		// refused outright on anything but a tools/call request.
		{"2026 tools/call with mcp-param", call2026(`"refund"`), h2026("mcp-param-region", "eu"), "", ""},
		{"2026 tools/list with mcp-param", `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`, withJSON("mcp-protocol-version", "2026-07-28", "mcp-method", "tools/list", "mcp-param-region", "eu"), deny.HeaderMismatch, "mcp-param-* headers mirror the arguments of a tools/call request"},
		{"2025-06-18 ping with mcp-param", ping, withJSON("mcp-param-region", "eu"), deny.HeaderMismatch, "tools/call request"},
		{"notification with mcp-param", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, withJSON("mcp-param-region", "eu"), deny.HeaderMismatch, "tools/call request"},
		{"response with mcp-param", `{"jsonrpc":"2.0","id":1,"result":{}}`, withJSON("mcp-param-region", "eu"), deny.HeaderMismatch, "tools/call request"},
		{"batch with mcp-param", `[` + refund(refundArgs) + `]`, withJSON("mcp-param-region", "eu"), deny.HeaderMismatch, "tools/call request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.body), tt.headers, Limits{})
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("Parse = %v, want it accepted", err)
				}
				return
			}
			d, ok := deny.As(err)
			if !ok || d.Reason != tt.reason || !strings.Contains(d.Detail, tt.detail) {
				t.Errorf("Parse = %v\nwant reason %s with detail containing %q", err, tt.reason, tt.detail)
			}
		})
	}
}

func TestDecodeHeaderValue(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"refund", "refund", true},
		{"", "", true},
		{"=?base64?dMO2w7ZsX3VuaWNvZGU=?=", "tööl_unicode", true},
		{"=?base64??=", "", true},
		{"=?base64?dMO2w7ZsX3VuaWNvZGU=", "=?base64?dMO2w7ZsX3VuaWNvZGU=", true},
		{"=?base64?not base64?=", "", false},
		{"=?base64?dMO2w7ZsX3VuaWNvZGU?=", "", false}, // missing padding
		{"=?base64?ZXV=?=", "", false},                // trailing bits set
		{"=?base64?ZX\nU=?=", "", false},              // a line break, which encoding/base64 would skip
		{"=?base64?Pz8-?=", "", false},                // URL alphabet
		{"=?base64?/w==?=", "", false},                // not UTF-8
	}
	for _, tt := range tests {
		got, ok := DecodeHeaderValue(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("DecodeHeaderValue(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// Name is read from the body, whatever the headers say, in every
// version; it is what Mcp-Name would mirror, and nothing for a method
// whose Mcp-Name the spec does not define.
func TestMessageName(t *testing.T) {
	tests := []struct {
		name, body string
		headers    map[string]string
		want       string
	}{
		{"tools/call 2026", call2026(`"refund"`), h2026(), "refund"},
		{"tools/call with an escaped name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t\u00f6\u00f6l"}}`, withJSON(), "tööl"},
		{"tools/call 2025-11-25", refund(refundArgs), withJSON("mcp-protocol-version", "2025-11-25"), "refund"},
		{"prompts/get", `{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{"name":"greet","arguments":{"name":"x"}}}`, withJSON("mcp-protocol-version", "2025-06-18"), "greet"},
		{"prompts/get without a name", `{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{}}`, withJSON(), ""},
		{"resources/read", `{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"file:///a b","name":"not this"}}`, withJSON(), "file:///a b"},
		{"resources/read without params", `{"jsonrpc":"2.0","id":2,"method":"resources/read"}`, withJSON(), ""},
		// The spec defines no Mcp-Name for these: a name in params is not it.
		{"tools/list", `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"name":"x"}}`, withJSON(), ""},
		{"resources/subscribe", `{"jsonrpc":"2.0","id":2,"method":"resources/subscribe","params":{"uri":"file:///a"}}`, withJSON(), ""},
		{"initialize", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}`, withJSON(), ""},
		{"response", `{"jsonrpc":"2.0","id":1,"result":{}}`, withJSON(), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Parse([]byte(tt.body), tt.headers, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Messages[0].Name(); got != tt.want {
				t.Errorf("Name() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestEncoded(t *testing.T) {
	for ce, want := range map[string]bool{"": false, "identity": false, " Identity ": false, "gzip": true, "br": true, "gzip, identity": true} {
		if got := Encoded(ce); got != want {
			t.Errorf("Encoded(%q) = %v, want %v", ce, got, want)
		}
	}
}
