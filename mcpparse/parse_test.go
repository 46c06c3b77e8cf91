package mcpparse

import (
	"strings"
	"testing"

	"github.com/capsnap/capsnap/deny"
)

// withJSON returns the headers of an ordinary POST plus kv.
func withJSON(kv ...string) map[string]string {
	h := map[string]string{"content-type": "application/json"}
	for i := 0; i < len(kv); i += 2 {
		h[kv[i]] = kv[i+1]
	}
	return h
}

// call is a tools/call request with the given params.
func call(params string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":` + params + `}`
}

// refund is a tools/call of refund with the given arguments.
func refund(args string) string {
	return call(`{"name":"refund","arguments":` + args + `}`)
}

const refundArgs = `{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`

// TestParseRejects has one row per strictness rule; the detail is matched
// as a substring so that each row proves the rule it names fired.
func TestParseRejects(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		headers map[string]string
		lim     Limits
		reason  deny.Reason
		detail  string
	}{
		// Size and emptiness.
		{"empty body", ``, nil, Limits{}, deny.MalformedRequest, "empty body"},
		{"only whitespace", " \n\t", nil, Limits{}, deny.MalformedRequest, "only whitespace"},
		{"over MaxBodyBytes", refund(refundArgs), nil, Limits{MaxBodyBytes: 64}, deny.MalformedRequest, "over the limit of 64"},

		// Duplicate member names, at every depth and however spelled.
		{"duplicate top-level member", `{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"refund"}}`, nil, Limits{}, deny.MalformedRequest, `duplicate member name "method"`},
		{"duplicate params member", call(`{"name":"lookup","name":"refund"}`), nil, Limits{}, deny.MalformedRequest, `duplicate member name "name"`},
		{"duplicate argument", refund(`{"amount":40,"amount":4000}`), nil, Limits{}, deny.MalformedRequest, `duplicate member name "amount"`},
		{"duplicate deep in arguments", refund(`{"order":{"lines":[{"sku":"a","sku":"b"}]}}`), nil, Limits{}, deny.MalformedRequest, `duplicate member name "sku"`},
		{"duplicate through an escape", refund(`{"amount":40,"\u0061mount":4000}`), nil, Limits{}, deny.MalformedRequest, `duplicate member name "amount"`},
		{"arguments differing in case", refund(`{"amount":40,"AMOUNT":4000}`), nil, Limits{}, deny.MalformedRequest, `"amount" and "AMOUNT" differ only in letter case`},
		{"arguments folding through the Kelvin sign", refund(`{"kind":"a","\u212aind":"b"}`), nil, Limits{}, deny.MalformedRequest, "differ only in letter case"},
		{"duplicate among many members", refund(`{"a0":0,"a1":1,"a2":2,"a3":3,"a4":4,"a5":5,"a6":6,"a7":7,"a8":8,"a9":9,"b0":0,"b1":1,"b2":2,"b3":3,"b4":4,"b5":5,"b6":6,"b7":7,"B3":3}`), nil, Limits{}, deny.MalformedRequest, `"b3" and "B3" differ only in letter case`},

		// Bytes after the value.
		{"trailing garbage", refund(refundArgs) + ` x`, nil, Limits{}, deny.MalformedRequest, "trailing data"},
		{"two concatenated messages", refund(refundArgs) + refund(refundArgs), nil, Limits{}, deny.MalformedRequest, "trailing data"},
		{"trailing NUL", refund(refundArgs) + "\x00", nil, Limits{}, deny.MalformedRequest, "trailing data"},

		// Encoding.
		{"invalid UTF-8 in a string", refund(`{"reason_code":"dup` + "\xff" + `"}`), nil, Limits{}, deny.MalformedRequest, "invalid UTF-8"},
		{"invalid UTF-8 in a key", refund(`{"am` + "\xc3" + `ount":1}`), nil, Limits{}, deny.MalformedRequest, "invalid UTF-8"},
		{"overlong UTF-8 encoding", refund(`{"path":"` + "\xc0\xaf" + `"}`), nil, Limits{}, deny.MalformedRequest, "invalid UTF-8"},
		{"UTF-8-encoded surrogate", refund(`{"s":"` + "\xed\xa0\x80" + `"}`), nil, Limits{}, deny.MalformedRequest, "invalid UTF-8"},
		{"leading byte order mark", "\xef\xbb\xbf" + refund(refundArgs), nil, Limits{}, deny.MalformedRequest, "byte order mark"},
		{"lone high surrogate", refund(`{"s":"\ud800"}`), nil, Limits{}, deny.MalformedRequest, "high surrogate not followed by a low one"},
		{"high surrogate then a letter", refund(`{"s":"\ud800\u0041"}`), nil, Limits{}, deny.MalformedRequest, "high surrogate not followed by a low one"},
		{"lone low surrogate", refund(`{"s":"\udc00"}`), nil, Limits{}, deny.MalformedRequest, "low surrogate without a high one"},
		{"surrogates in the wrong order", refund(`{"s":"\udc00\ud800"}`), nil, Limits{}, deny.MalformedRequest, "low surrogate without a high one"},
		{"lone surrogate in a key", refund(`{"\ud83d":1}`), nil, Limits{}, deny.MalformedRequest, "high surrogate"},
		{"short \\u escape", refund(`{"s":"\u12"}`), nil, Limits{}, deny.MalformedRequest, "four hex digits"},
		{"unknown escape", refund(`{"s":"\x41"}`), nil, Limits{}, deny.MalformedRequest, "invalid escape"},
		{"raw control character in a string", refund(`{"s":"a` + "\n" + `b"}`), nil, Limits{}, deny.MalformedRequest, "must be escaped"},

		// Numbers.
		{"number beyond a double", refund(`{"amount":1e309}`), nil, Limits{}, deny.MalformedRequest, "beyond the range of a double"},
		{"negative number beyond a double", refund(`{"amount":-1.8e308}`), nil, Limits{}, deny.MalformedRequest, "beyond the range of a double"},
		{"long integer beyond a double", refund(`{"amount":` + "1" + strings.Repeat("0", 309) + `}`), nil, Limits{}, deny.MalformedRequest, "beyond the range of a double"},
		{"huge exponent", refund(`{"amount":1e99999999999999999999}`), nil, Limits{}, deny.MalformedRequest, "beyond the range of a double"},
		{"leading zero", refund(`{"amount":040}`), nil, Limits{}, deny.MalformedRequest, "unexpected '4'"},
		{"leading plus", refund(`{"amount":+40}`), nil, Limits{}, deny.MalformedRequest, "unexpected '+'"},
		{"NaN", refund(`{"amount":NaN}`), nil, Limits{}, deny.MalformedRequest, "unexpected 'N'"},
		{"bare decimal point", refund(`{"amount":40.}`), nil, Limits{}, deny.MalformedRequest, "digit after '.'"},

		// Nesting.
		{"nesting deeper than MaxDepth", refund(`{"a":` + strings.Repeat("[", 62) + strings.Repeat("]", 62) + `}`), nil, Limits{}, deny.MalformedRequest, "nesting deeper than 64"},
		{"MaxDepth is capped", refund(`{"a":` + strings.Repeat("[", 998) + strings.Repeat("]", 998) + `}`), nil, Limits{MaxDepth: 1 << 30}, deny.MalformedRequest, "nesting deeper than 1000"},
		{"nesting deeper than a small MaxDepth", refund(`{"a":{"b":1}}`), nil, Limits{MaxDepth: 3}, deny.MalformedRequest, "nesting deeper than 3"},

		// Not a message.
		{"JSON null", `null`, nil, Limits{}, deny.MalformedRequest, "JSON null, not a JSON-RPC message"},
		{"JSON string", `"tools/call"`, nil, Limits{}, deny.MalformedRequest, "JSON string, not a JSON-RPC message"},
		{"not JSON", `jsonrpc=2.0`, nil, Limits{}, deny.MalformedRequest, "not strict JSON"},
		{"unterminated", refund(refundArgs)[:40], nil, Limits{}, deny.MalformedRequest, "not strict JSON"},

		// The version tag.
		{"no jsonrpc", `{"id":1,"method":"ping"}`, nil, Limits{}, deny.MalformedRequest, `"jsonrpc" must be the string "2.0"`},
		{"jsonrpc 1.0", `{"jsonrpc":"1.0","id":1,"method":"ping"}`, nil, Limits{}, deny.MalformedRequest, `"jsonrpc" must be the string "2.0"`},
		{"jsonrpc as a number", `{"jsonrpc":2.0,"id":1,"method":"ping"}`, nil, Limits{}, deny.MalformedRequest, `"jsonrpc" must be the string "2.0"`},
		{"jsonrpc with a space", `{"jsonrpc":"2.0 ","id":1,"method":"ping"}`, nil, Limits{}, deny.MalformedRequest, `"jsonrpc" must be the string "2.0"`},

		// params.
		{"params array", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["refund",{}]}`, nil, Limits{}, deny.MalformedRequest, `"params" must be an object, not a JSON array`},
		{"params null", `{"jsonrpc":"2.0","id":1,"method":"ping","params":null}`, nil, Limits{}, deny.MalformedRequest, `"params" must be an object, not a JSON null`},
		{"params string", `{"jsonrpc":"2.0","id":1,"method":"ping","params":"x"}`, nil, Limits{}, deny.MalformedRequest, `"params" must be an object`},
		{"_meta not an object", call(`{"name":"refund","_meta":[]}`), nil, Limits{}, deny.MalformedRequest, "params._meta must be an object"},

		// method.
		{"method a number", `{"jsonrpc":"2.0","id":1,"method":7}`, nil, Limits{}, deny.MalformedRequest, `"method" must be a string, not a JSON number`},
		{"method null", `{"jsonrpc":"2.0","id":1,"method":null}`, nil, Limits{}, deny.MalformedRequest, `"method" must be a string, not a JSON null`},
		{"method empty", `{"jsonrpc":"2.0","id":1,"method":""}`, nil, Limits{}, deny.MalformedRequest, "method is empty"},
		{"method with NUL", `{"jsonrpc":"2.0","id":1,"method":"tools/call\u0000","params":{"name":"refund"}}`, nil, Limits{}, deny.MalformedRequest, "U+0000"},
		{"method with a space", `{"jsonrpc":"2.0","id":1,"method":"tools/call "}`, nil, Limits{}, deny.MalformedRequest, "U+0020"},
		{"method and result", `{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}`, nil, Limits{}, deny.MalformedRequest, "must not have a result or an error"},
		{"method and error", `{"jsonrpc":"2.0","id":1,"method":"ping","error":{"code":1,"message":"x"}}`, nil, Limits{}, deny.MalformedRequest, "must not have a result or an error"},

		// ids.
		{"null id on a request", `{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"refund"}}`, nil, Limits{}, deny.MalformedRequest, "null id"},
		{"fractional id", `{"jsonrpc":"2.0","id":1.5,"method":"ping"}`, nil, Limits{}, deny.MalformedRequest, "not an integer"},
		{"exponent id", `{"jsonrpc":"2.0","id":1e2,"method":"ping"}`, nil, Limits{}, deny.MalformedRequest, "not an integer"},
		{"negative zero id", `{"jsonrpc":"2.0","id":-0,"method":"ping"}`, nil, Limits{}, deny.MalformedRequest, "-0"},
		{"id beyond 2^53", `{"jsonrpc":"2.0","id":9007199254740992,"method":"ping"}`, nil, Limits{}, deny.MalformedRequest, "beyond ±(2^53-1)"},
		{"bool id", `{"jsonrpc":"2.0","id":true,"method":"ping"}`, nil, Limits{}, deny.MalformedRequest, "not a JSON boolean"},
		{"object id", `{"jsonrpc":"2.0","id":{},"method":"ping"}`, nil, Limits{}, deny.MalformedRequest, "not a JSON object"},
		{"array id", `{"jsonrpc":"2.0","id":[1],"method":"ping"}`, nil, Limits{}, deny.MalformedRequest, "not a JSON array"},

		// Responses.
		{"response without id", `{"jsonrpc":"2.0","result":{}}`, nil, Limits{}, deny.MalformedRequest, "a response must have a string or integer id"},
		{"response with null id", `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"x"}}`, nil, Limits{}, deny.MalformedRequest, "a response must have a string or integer id"},
		{"result and error", `{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"x"}}`, nil, Limits{}, deny.MalformedRequest, "both a result and an error"},
		{"neither method nor result", `{"jsonrpc":"2.0","id":1}`, nil, Limits{}, deny.MalformedRequest, "neither a method nor a result"},
		{"result not an object", `{"jsonrpc":"2.0","id":1,"result":"ok"}`, nil, Limits{}, deny.MalformedRequest, `"result" must be an object`},
		{"response with params", `{"jsonrpc":"2.0","id":1,"result":{},"params":{}}`, nil, Limits{}, deny.MalformedRequest, "must not have params"},
		{"error without code", `{"jsonrpc":"2.0","id":1,"error":{"message":"x"}}`, nil, Limits{}, deny.MalformedRequest, `"code" must be an integer`},
		{"fractional error code", `{"jsonrpc":"2.0","id":1,"error":{"code":1.5,"message":"x"}}`, nil, Limits{}, deny.MalformedRequest, `"code" must be an integer`},
		{"error message not a string", `{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":1}}`, nil, Limits{}, deny.MalformedRequest, `"message" must be a string`},
		{"unknown error member", `{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x","Code":2}}`, nil, Limits{}, deny.MalformedRequest, "letter case"},

		// tools/call.
		{"tools/call without params", `{"jsonrpc":"2.0","id":1,"method":"tools/call"}`, nil, Limits{}, deny.MalformedRequest, "tools/call has no params"},
		{"tools/call without name", call(`{"arguments":{}}`), nil, Limits{}, deny.MalformedRequest, "params.name must be a string"},
		{"tools/call name a number", call(`{"name":7}`), nil, Limits{}, deny.MalformedRequest, "params.name must be a string"},
		{"tools/call name null", call(`{"name":null}`), nil, Limits{}, deny.MalformedRequest, "params.name must be a string"},
		{"tools/call name empty", call(`{"name":""}`), nil, Limits{}, deny.MalformedRequest, "tool name is empty"},
		{"tool name with NUL", call(`{"name":"refund\u0000"}`), nil, Limits{}, deny.MalformedRequest, "U+0000"},
		{"tool name with BEL", call(`{"name":"ref\u0007und"}`), nil, Limits{}, deny.MalformedRequest, "U+0007"},
		{"tool name with a bidi override", call(`{"name":"refund\u202e"}`), nil, Limits{}, deny.MalformedRequest, "U+202E"},
		{"tool name with a zero-width space", call(`{"name":"re\u200bfund"}`), nil, Limits{}, deny.MalformedRequest, "U+200B"},
		{"tool name with a trailing space", call(`{"name":"refund "}`), nil, Limits{}, deny.MalformedRequest, "U+0020"},
		{"arguments an array", refund(`[1,2]`), nil, Limits{}, deny.MalformedRequest, "arguments must be an object, not a JSON array"},
		{"arguments a string", refund(`"{}"`), nil, Limits{}, deny.MalformedRequest, "arguments must be an object"},
		{"tools/call as a notification", `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"refund"}}`, nil, Limits{}, deny.MalformedRequest, "must be a request with an id"},

		// Governing names in another case, and unknown members.
		{"Method instead of method", `{"jsonrpc":"2.0","id":1,"Method":"tools/call","params":{"name":"refund"}}`, nil, Limits{}, deny.MalformedRequest, `member "Method" is "method" in another letter case`},
		{"method beside METHOD", `{"jsonrpc":"2.0","id":1,"method":"ping","METHOD":"tools/call"}`, nil, Limits{}, deny.MalformedRequest, "differ only in letter case"},
		{"Params", `{"jsonrpc":"2.0","id":1,"method":"tools/call","Params":{"name":"refund"}}`, nil, Limits{}, deny.MalformedRequest, `"Params" is "params"`},
		{"ID", `{"jsonrpc":"2.0","ID":1,"method":"ping"}`, nil, Limits{}, deny.MalformedRequest, `"ID" is "id"`},
		{"JSONRPC", `{"JSONRPC":"2.0","id":1,"method":"ping"}`, nil, Limits{}, deny.MalformedRequest, `"JSONRPC" is "jsonrpc"`},
		{"params with long s", `{"jsonrpc":"2.0","id":1,"method":"ping","param\u017f":{}}`, nil, Limits{}, deny.MalformedRequest, `is "params" in another letter case`},
		{"unknown top-level member", `{"jsonrpc":"2.0","id":1,"method":"ping","extra":1}`, nil, Limits{}, deny.MalformedRequest, `unknown JSON-RPC member "extra"`},
		{"NAME in params", call(`{"NAME":"refund"}`), nil, Limits{}, deny.MalformedRequest, `params member "NAME" is "name"`},
		{"Arguments in params", call(`{"name":"lookup","Arguments":{"amount":4000}}`), nil, Limits{}, deny.MalformedRequest, `params member "Arguments" is "arguments"`},
		{"_META in params", call(`{"name":"refund","_META":{}}`), nil, Limits{}, deny.MalformedRequest, `params member "_META" is "_meta"`},
		{"name escaped into another case", call(`{"\u004eame":"refund"}`), nil, Limits{}, deny.MalformedRequest, `params member "Name" is "name"`},

		// Batches.
		{"empty batch", `[]`, nil, Limits{}, deny.MalformedRequest, "empty batch"},
		{"batch in 2025-06-18", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, withJSON("mcp-protocol-version", "2025-06-18"), Limits{}, deny.MalformedRequest, "batches are allowed only in protocol version 2025-03-26, not 2025-06-18"},
		{"batch in 2025-11-25", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, withJSON("mcp-protocol-version", "2025-11-25"), Limits{}, deny.MalformedRequest, "not 2025-11-25"},
		{"batch in 2026-07-28", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, withJSON("mcp-protocol-version", "2026-07-28"), Limits{}, deny.MalformedRequest, "not 2026-07-28"},
		{"batch over MaxBatch", "[" + strings.Repeat(`{"jsonrpc":"2.0","method":"notifications/progress"},`, MaxBatch) + `{"jsonrpc":"2.0","method":"notifications/progress"}]`, nil, Limits{}, deny.MalformedRequest, "more than 64 messages"},
		{"batch element not an object", `[{"jsonrpc":"2.0","id":1,"method":"ping"},1]`, nil, Limits{}, deny.MalformedRequest, "batch element 1 is a JSON number"},
		{"nested batch", `[[{"jsonrpc":"2.0","id":1,"method":"ping"}]]`, nil, Limits{}, deny.MalformedRequest, "batch element 0 is a JSON array"},
		{"batch element malformed", `[{"jsonrpc":"2.0","id":1,"method":"ping"},` + call(`{"name":"refund","arguments":[]}`) + `]`, nil, Limits{}, deny.MalformedRequest, "batch element 1: tools/call params.arguments must be an object"},
		{"batch element with duplicate keys", `[{"jsonrpc":"2.0","id":1,"method":"ping"},` + refund(`{"amount":1,"amount":2}`) + `]`, nil, Limits{}, deny.MalformedRequest, "duplicate member name"},
		{"initialize in a batch", `[{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}]`, nil, Limits{}, deny.MalformedRequest, "initialize must not be part of a batch"},
		{"batch with a repeated id", `[{"jsonrpc":"2.0","id":1,"method":"ping"},` + refund(refundArgs) + `]`, nil, Limits{}, deny.MalformedRequest, `share the id "1"`},
		{"batch with two answers to one id", `[{"jsonrpc":"2.0","id":7,"result":{}},{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"x"}}]`, nil, Limits{}, deny.MalformedRequest, "share the id"},
		{"batch with a repeated string id", `[{"jsonrpc":"2.0","id":"a","method":"ping"},{"jsonrpc":"2.0","id":"\u0061","method":"ping"}]`, nil, Limits{}, deny.MalformedRequest, "share the id"},

		// Versions named in the body.
		{"initialize with an unknown version", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05"}}`, nil, Limits{}, deny.MalformedRequest, `"2024-11-05", which capsnap does not speak`},
		{"initialize version not a string", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":20250326}}`, nil, Limits{}, deny.MalformedRequest, "protocolVersion must be a string"},
		{"_meta version not a string", call(`{"name":"refund","_meta":{"io.modelcontextprotocol/protocolVersion":1}}`), nil, Limits{}, deny.MalformedRequest, "must be a string"},
		{"_meta version unknown", call(`{"name":"refund","_meta":{"io.modelcontextprotocol/protocolVersion":"2027-01-01"}}`), withJSON("mcp-protocol-version", "2026-07-28"), Limits{}, deny.MalformedRequest, `"2027-01-01", which capsnap does not speak`},
		{"batch naming two versions", `[{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-03-26"}}},{"jsonrpc":"2.0","id":2,"method":"ping","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-06-18"}}}]`, nil, Limits{}, deny.MalformedRequest, "different protocol versions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.headers
			if h == nil {
				h = withJSON()
			}
			r, err := Parse([]byte(tt.body), h, tt.lim)
			if err == nil {
				t.Fatalf("Parse accepted %q: %+v", tt.body, r)
			}
			d, ok := err.(*deny.Error)
			if !ok {
				t.Fatalf("error %v is a %T, not a *deny.Error", err, err)
			}
			if d.Reason != tt.reason || !strings.Contains(d.Detail, tt.detail) {
				t.Errorf("Parse = %v\nwant reason %s with detail containing %q", err, tt.reason, tt.detail)
			}
			if len(d.Detail) > 400 {
				t.Errorf("detail is %d bytes; details must stay short", len(d.Detail))
			}
		})
	}
}

func TestParseAccepts(t *testing.T) {
	type msg struct {
		kind             Kind
		id, method, tool string
		args             string
	}
	tests := []struct {
		name    string
		body    string
		headers map[string]string
		lim     Limits
		version Version
		batch   bool
		want    []msg
	}{
		{"tools/call", refund(refundArgs), nil, Limits{}, V20250326, false, []msg{{KindRequest, "1", "tools/call", "refund", refundArgs}}},
		{"whitespace around and inside", " \r\n\t{ \"jsonrpc\" : \"2.0\" , \"id\" : 1 , \"method\" : \"tools/call\" , \"params\" : { \"name\" : \"refund\" } }\n", nil, Limits{}, V20250326, false, []msg{{KindRequest, "1", "tools/call", "refund", ""}}},
		{"escaped method and name", `{"jsonrpc":"2\u002e0","id":"a\"b","method":"tools\/call","params":{"name":"re\u0066und"}}`, nil, Limits{}, V20250326, false, []msg{{KindRequest, `"a\"b"`, "tools/call", "refund", ""}}},
		{"non-ASCII tool name", call(`{"name":"tööl_unicode"}`), nil, Limits{}, V20250326, false, []msg{{KindRequest, "1", "tools/call", "tööl_unicode", ""}}},
		{"surrogate pair", refund(`{"note":"\ud83d\ude00"}`), nil, Limits{}, V20250326, false, []msg{{KindRequest, "1", "tools/call", "refund", `{"note":"\ud83d\ude00"}`}}},
		{"tools/call without arguments", call(`{"name":"refund"}`), nil, Limits{}, V20250326, false, []msg{{KindRequest, "1", "tools/call", "refund", ""}}},
		// Every server reads null as no arguments (or refuses it); the Go
		// SDK's client sends it for a nil map.
		{"tools/call with null arguments", refund(`null`), nil, Limits{}, V20250326, false, []msg{{KindRequest, "1", "tools/call", "refund", ""}}},
		{"extreme but finite numbers", refund(`{"a":1.7976931348623157e308,"b":-1e-400,"c":0e999999,"d":0.000e400}`), nil, Limits{}, V20250326, false, []msg{{KindRequest, "1", "tools/call", "refund", `{"a":1.7976931348623157e308,"b":-1e-400,"c":0e999999,"d":0.000e400}`}}},
		{"nesting at MaxDepth", refund(`{"a":` + strings.Repeat("[", 61) + strings.Repeat("]", 61) + `}`), nil, Limits{}, V20250326, false, []msg{{KindRequest, "1", "tools/call", "refund", `{"a":` + strings.Repeat("[", 61) + strings.Repeat("]", 61) + `}`}}},
		{"many distinct members", refund(`{"a0":0,"a1":1,"a2":2,"a3":3,"a4":4,"a5":5,"a6":6,"a7":7,"a8":8,"a9":9,"b0":0,"b1":1,"b2":2,"b3":3,"b4":4,"b5":5,"b6":6,"b7":7}`), nil, Limits{}, V20250326, false, []msg{{KindRequest, "1", "tools/call", "refund", `{"a0":0,"a1":1,"a2":2,"a3":3,"a4":4,"a5":5,"a6":6,"a7":7,"a8":8,"a9":9,"b0":0,"b1":1,"b2":2,"b3":3,"b4":4,"b5":5,"b6":6,"b7":7}`}}},
		{"largest safe ids", `{"jsonrpc":"2.0","id":-9007199254740991,"method":"ping"}`, nil, Limits{}, V20250326, false, []msg{{KindRequest, "-9007199254740991", "ping", "", ""}}},
		{"id zero", `{"jsonrpc":"2.0","id":0,"method":"ping"}`, nil, Limits{}, V20250326, false, []msg{{KindRequest, "0", "ping", "", ""}}},
		{"notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil, Limits{}, V20250326, false, []msg{{KindNotification, "", "notifications/initialized", "", ""}}},
		{"custom method", `{"jsonrpc":"2.0","id":1,"method":"x-acme/report"}`, nil, Limits{}, V20250326, false, []msg{{KindRequest, "1", "x-acme/report", "", ""}}},
		{"result response", `{"jsonrpc":"2.0","id":3,"result":{"action":"accept","content":{"ok":true}}}`, nil, Limits{}, V20250326, false, []msg{{KindResponse, "3", "", "", ""}}},
		{"error response", `{"jsonrpc":"2.0","id":"s-1","error":{"code":-32601,"message":"no","data":{"x":1}}}`, nil, Limits{}, V20250326, false, []msg{{KindResponse, `"s-1"`, "", "", ""}}},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":2,"result":{}},{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"refund","arguments":{"amount":1}}}]`, nil, Limits{}, V20250326, true, []msg{{KindRequest, "1", "ping", "", ""}, {KindNotification, "", "notifications/initialized", "", ""}, {KindResponse, "2", "", "", ""}, {KindRequest, "4", "tools/call", "refund", `{"amount":1}`}}},
		{"batch with a call and an answer sharing an id", `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":1,"result":{}}]`, nil, Limits{}, V20250326, true, []msg{{KindRequest, "1", "ping", "", ""}, {KindResponse, "1", "", "", ""}}},
		{"batch of 64", "[" + strings.Repeat(`{"jsonrpc":"2.0","method":"notifications/progress"},`, MaxBatch-1) + `{"jsonrpc":"2.0","method":"notifications/progress"}]`, nil, Limits{}, V20250326, true, nil},
		{"initialize names the version", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`, nil, Limits{}, V20250618, false, []msg{{KindRequest, "0", "initialize", "", ""}}},
		{"limits above the caps", refund(`{"amount":40}`), nil, Limits{MaxBodyBytes: 1 << 30, MaxDepth: 1 << 30}, V20250326, false, []msg{{KindRequest, "1", "tools/call", "refund", `{"amount":40}`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.headers
			if h == nil {
				h = withJSON()
			}
			r, err := Parse([]byte(tt.body), h, tt.lim)
			if err != nil {
				t.Fatalf("Parse(%q) = %v", tt.body, err)
			}
			if r.Version != tt.version || r.Batch != tt.batch {
				t.Errorf("version %s batch %v, want %s %v", r.Version, r.Batch, tt.version, tt.batch)
			}
			if tt.want == nil {
				return
			}
			if len(r.Messages) != len(tt.want) {
				t.Fatalf("%d messages, want %d", len(r.Messages), len(tt.want))
			}
			for i, w := range tt.want {
				m := r.Messages[i]
				got := msg{m.Kind, string(m.ID), m.Method, m.Tool, string(m.Arguments)}
				if got != w {
					t.Errorf("message %d = %+v, want %+v", i, got, w)
				}
			}
		})
	}
}

// TestParseRefusalAnswersItsID: a message refused once its id could be read
// comes back with that id, for the refusal to answer (an error for id null
// is one no client can match to its request); one whose id cannot be read,
// or that is a response, comes back with none.
func TestParseRefusalAnswersItsID(t *testing.T) {
	tests := []struct {
		name, body string
		headers    map[string]string
		id         string // "" for no message returned
	}{
		{"method in another letter case", `{"jsonrpc":"2.0","id":1,"Method":"tools/call","params":{"name":"refund"}}`, nil, `1`},
		{"unknown member before the id", `{"jsonrpc":"2.0","extra":1,"id":"a-2","method":"ping"}`, nil, `"a-2"`},
		{"two unknown members", `{"x":1,"jsonrpc":"2.0","y":2,"id":3,"method":"ping"}`, nil, `3`},
		{"jsonrpc 1.0", `{"jsonrpc":"1.0","id":4,"method":"ping"}`, nil, `4`},
		{"method a number", `{"jsonrpc":"2.0","id":5,"method":7}`, nil, `5`},
		{"method with a space", `{"jsonrpc":"2.0","id":6,"method":"tools/call "}`, nil, `6`},
		{"method in another case", `{"jsonrpc":"2.0","id":7,"method":"Tools/Call","params":{"name":"refund"}}`, nil, `7`},
		{"neither method nor result", `{"jsonrpc":"2.0","id":8}`, nil, `8`},
		{"tools/call without params", `{"jsonrpc":"2.0","id":9,"method":"tools/call"}`, nil, `9`},
		{"tools/call name a number", call(`{"name":7}`), nil, `1`},
		{"_meta version unknown", call(`{"name":"refund","_meta":{"io.modelcontextprotocol/protocolVersion":"2027-01-01"}}`), withJSON("mcp-protocol-version", "2026-07-28"), `1`},
		{"mcp-method disagrees", call(`{"name":"refund","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}`), withJSON("mcp-protocol-version", "2026-07-28", "mcp-method", "tools/list", "mcp-name", "refund"), `1`},

		{"null id", `{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"refund"}}`, nil, ""},
		{"fractional id", `{"jsonrpc":"2.0","id":1.5,"method":"ping"}`, nil, ""},
		{"id in another letter case", `{"jsonrpc":"2.0","ID":1,"method":"ping"}`, nil, ""},
		{"two ids", `{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}`, nil, ""},
		{"response with params", `{"jsonrpc":"2.0","id":1,"result":{},"params":{}}`, nil, ""},
		{"method and result", `{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}`, nil, ""},
		{"batch element", `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"1.0","id":2,"method":"ping"}]`, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.headers
			if h == nil {
				h = withJSON()
			}
			r, err := Parse([]byte(tt.body), h, Limits{})
			if _, ok := err.(*deny.Error); !ok {
				t.Fatalf("Parse(%q) = %v, want a denial", tt.body, err)
			}
			got := ""
			if r != nil {
				if len(r.Messages) != 1 {
					t.Fatalf("a refused body came back with %d messages", len(r.Messages))
				}
				got = string(r.Messages[0].ID)
			}
			if got != tt.id {
				t.Errorf("the refusal answers id %q, want %q (%v)", got, tt.id, err)
			}
		})
	}
}
