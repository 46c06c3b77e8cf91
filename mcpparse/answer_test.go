package mcpparse

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf16"
)

func TestCarriesResult(t *testing.T) {
	const listing = `{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`
	tests := []struct {
		name, contentType, encoding, body string
		want                              bool
	}{
		{"a listing", "application/json", "", listing, true},
		{"a listing in an event", "text/event-stream", "", "data:\n\ndata: " + listing + "\n\n", true},
		{"a result beside a request in a batch", "application/json", "", `[{"jsonrpc":"2.0","id":9,"method":"ping"},{"jsonrpc":"2.0","id":1,"result":{}}]`, true},
		{"an empty result", "application/json", "", `{"jsonrpc":"2.0","id":1,"result":{}}`, true},
		{"JSON named in a parameter", "text/plain; profile=application/json", "", listing, true},
		{"gzip", "application/json", "gzip", "\x1f\x8b", true},
		{"malformed, naming a result", "application/json", "", `{"result":{"tools":[`, true},
		{"malformed, a result in another case", "application/json", "", `{"RESULT":{}`, true},
		{"malformed, a result folded", "application/json", "", "{\"re\u017fult\":{}", true},
		{"malformed, an escape", "application/json", "", `{"\u0072esult":{},}`, true},
		{"a case variant of result", "application/json", "", `{"jsonrpc":"2.0","id":1,"Result":{}}`, true},
		{"a truncated event", "text/event-stream", "", "data: " + listing, true},
		{"two documents in one event", "text/event-stream", "", "data: " + listing + "\ndata: " + listing + "\n\n", true},
		{"gzip, JSON named in a parameter", "text/plain; x=json", "gzip", "\x1f\x8b", true},
		// Framings that clients read differently (FramingOther).
		{"JSON with an event stream in a parameter", `application/json; profile="text/event-stream"`, "", listing, true},
		{"both types", "application/json, text/event-stream", "", listing, true},
		{"events in UTF-16", "text/event-stream; charset=utf-16le", "", utf16LE("data: " + listing + "\n\n"), true},
		{"JSON in UTF-16, no charset", "application/json; x=1", "", utf16LE(listing), true},
		{"events as text/plain", "text/plain", "", "data: " + listing + "\n\n", true},
		{"events with no content type", "", "", "id: 1\r\ndata: " + listing + "\r\n\r\n", true},
		{"an event split by a lone CR", "text/plain", "", "retry: 1\rdata: " + listing + "\n\n", true},
		{"an event after a byte order mark", "", "", "\ufeffdata: " + listing + "\n\n", true},
		{"an unknown charset", "text/plain; charset=utf-7", "", "+AHQ-", true},

		{"empty", "application/json", "", "", false},
		{"whitespace", "application/json", "", " \n", false},
		{"error id null", "application/json", "", `{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}`, false},
		{"error without id", "application/json", "", `{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request"}}`, false},
		{"error in an event", "text/event-stream", "", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":1,\"message\":\"x\"}}\n\n", false},
		{"a notification in an event", "text/event-stream", "", "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n", false},
		{"problem+json", "application/problem+json", "", `{"type":"about:blank","title":"Not Found"}`, false},
		{"malformed, naming no result", "application/json", "", `{"error": "oops"`, false},
		{"HTML", "text/html", "", "<p>result</p>", false},
		{"no content type", "", "", listing, false},
		{"text/plain", "text/plain", "", listing, false},
		{"gzip, not JSON", "text/html", "gzip", "\x1f\x8b", false},
		{"a plain-text error page", "text/plain; charset=iso-8859-1", "", "upstream connect error: no tools, no result\n\n", false},
		{"an HTML 502", "text/html", "", "<html><body>502 Bad Gateway: the result of data: none</body></html>", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CarriesResult(tt.contentType, tt.encoding, []byte(tt.body), 0); got != tt.want {
				t.Errorf("CarriesResult(%q, %q, %q) = %v, want %v", tt.contentType, tt.encoding, tt.body, got, tt.want)
			}
		})
	}
}

// utf16LE is s in UTF-16, little-endian.
func utf16LE(s string) string {
	var b []byte
	for _, u := range utf16.Encode([]rune(s)) {
		b = append(b, byte(u), byte(u>>8))
	}
	return string(b)
}

func TestMayName(t *testing.T) {
	tests := []struct {
		b, name string
		want    bool
	}{
		{`{"tools":[]}`, "tools", true},
		{`{"TOOLS":[]}`, "tools", true},
		{"{\"tool\u017f\":[]}", "tools", true}, // ſ folds to s
		{"{\"\u212aey\":1}", "key", true},      // the Kelvin sign folds to k
		{`{"t\u006fols":[]}`, "tools", true},
		{`{"tool":[]}`, "tools", false},
		{`{"content":[{"type":"text","text":"tool s"}]}`, "tools", false},
		{"{\"t\u00f6ols\":1}", "tools", false},
		{"", "tools", false},
		{"too", "tools", false},
	}
	for _, tt := range tests {
		if got := MayName([]byte(tt.b), tt.name); got != tt.want {
			t.Errorf("MayName(%q, %q) = %v, want %v", tt.b, tt.name, got, tt.want)
		}
	}
}

// FuzzCarriesResult holds CarriesResult to what a lenient client reads: a
// JSON body it says carries no result is one in which Go's encoding/json,
// which matches member names up to case, finds none either.
func FuzzCarriesResult(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`,
		`{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}`,
		`[{"jsonrpc":"2.0","id":1,"Result":{}}]`,
		`{"error": "oops"`,
		"{\"re\u017fult\":1}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if CarriesResult("application/json", "", body, 0) {
			return
		}
		var one struct{ Result json.RawMessage }
		if json.Unmarshal(body, &one) == nil && one.Result != nil {
			t.Fatalf("CarriesResult is false, but encoding/json reads result %s in %q", one.Result, body)
		}
		var batch []struct{ Result json.RawMessage }
		if json.Unmarshal(body, &batch) == nil {
			for _, m := range batch {
				if m.Result != nil {
					t.Fatalf("CarriesResult is false, but encoding/json reads result %s in the batch %q", m.Result, body)
				}
			}
		}
	})
}

// FuzzWithholdListings holds WithholdListings to what a lenient client
// reads: in what it returns, Go's encoding/json (which matches names up to
// case) finds no result with a member named tools, alone or in a batch.
func FuzzWithholdListings(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`,
		`[{"jsonrpc":"2.0","id":1,"result":{"content":[]}},{"jsonrpc":"2.0","id":2,"result":{"Tools":[]}}]`,
		`{"jsonrpc":"2.0","id":1,"result":{"tools":[]},"result":{}}`,
		"{\"result\":{\"tool\u017f\":1}}",
	} {
		f.Add([]byte(s))
	}
	withhold := func([]byte) []byte {
		return []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":1,"message":"withheld"}}`)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		out := WithholdListings(doc, 0, withhold)
		type msg struct{ Result map[string]json.RawMessage }
		check := func(m msg) {
			for k := range m.Result {
				if bytes.EqualFold([]byte(k), []byte("tools")) {
					t.Fatalf("%q became %q, in which encoding/json reads a listing", doc, out)
				}
			}
		}
		var one msg
		if json.Unmarshal(out, &one) == nil {
			check(one)
		}
		var batch []msg
		if json.Unmarshal(out, &batch) == nil {
			for _, m := range batch {
				check(m)
			}
		}
	})
}
