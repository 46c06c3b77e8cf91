package decide

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/capsnap/capsnap/deny"
)

// Every answer that is not a tools/list's own passes byte for byte but for
// each listing in it, which is withheld: a JSON-RPC error for its id in its
// place, whatever stream or batch it came in.
func TestScreen(t *testing.T) {
	const (
		listing  = `{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"ghost","inputSchema":{"type":"object"}}]}}`
		callText = `{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"the tools you have"}]}}`
		sse      = "text/event-stream"
	)
	const malformed = `{"jsonrpc":"2.0","id":null,"error":{"code":-31000,"message":"capsnap denied the request: malformed_response"`
	withheldFor := func(id string) string {
		return `{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-31000,"message":"capsnap denied the request: listing_unbound"`
	}
	tests := []struct {
		name        string
		head        ResponseHead
		content     string
		want        []string // substrings of the result, in order; nil: unchanged
		withheld    int
		notIncluded string
		// whole says the answer is withheld whole, malformed_response.
		whole bool
	}{
		{name: "a call's result naming tools in its text", head: okJSON, content: callText},
		{name: "a notification", head: ResponseHead{Status: 200, ContentType: sse},
			content: "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n"},
		{name: "an error", head: okJSON, content: `{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}`},
		{name: "not JSON-RPC by its type", head: ResponseHead{Status: 200, ContentType: "text/html"}, content: listing},
		{name: "an HTML page with no event in it", head: ResponseHead{Status: 502, ContentType: "text/html"}, content: "<p>no tools: data: none</p>"},
		{name: "a listing on another request's JSON answer", head: okJSON, content: listing,
			want: []string{withheldFor("7")}, withheld: 1, notIncluded: "ghost"},
		{name: "a listing in a batch beside a call's result", head: okJSON, content: "[" + callText + " , " + listing + "]",
			want: []string{"[" + callText + ",", withheldFor("7")}, withheld: 1, notIncluded: "ghost"},
		{name: "a listing replayed on the GET stream", head: ResponseHead{Status: 200, ContentType: sse},
			content: "id: e1\ndata: " + callText + "\n\nid: e2\nevent: message\ndata: " + listing + "\n\n",
			want:    []string{"id: e1\ndata: " + callText + "\n\nid: e2\nevent: message\ndata: " + withheldFor("7")}, withheld: 1, notIncluded: "ghost"},
		{name: "tools in another letter case", head: okJSON, content: `{"jsonrpc":"2.0","id":"x","result":{"TOOLS":[]}}`,
			want: []string{withheldFor(`"x"`)}, withheld: 1},
		{name: "a listing with no id", head: okJSON, content: `{"jsonrpc":"2.0","result":{"tools":[]}}`,
			want: []string{withheldFor("null")}, withheld: 1},
		{name: "malformed, naming tools", head: okJSON, content: `{"jsonrpc":"2.0","id":7,"result":{"tools":[]},"result":{}}`,
			want: []string{withheldFor("null")}, withheld: 1},
		{name: "an event split by a lone CR, naming tools", head: ResponseHead{Status: 200, ContentType: sse}, content: "data: " + listing + "\r\r\n",
			want: []string{"event: message\ndata: " + withheldFor("null")}, withheld: 1, notIncluded: "ghost"},
		{name: "a truncated event naming tools", head: ResponseHead{Status: 200, ContentType: sse}, content: "data: " + listing,
			want: []string{"event: message\ndata: " + withheldFor("null")}, withheld: 1, notIncluded: "ghost"},
		{name: "compressed", head: ResponseHead{Status: 200, ContentType: jsonHead, ContentEncoding: "br"}, content: "\x1f",
			want: []string{malformed}, withheld: 1, whole: true},
		// Framings that clients read differently are withheld whole.
		{name: "JSON with an event stream named in a parameter", head: ResponseHead{Status: 200, ContentType: `application/json; profile="text/event-stream"`},
			content: listing, want: []string{malformed}, withheld: 1, whole: true, notIncluded: "ghost"},
		{name: "events in UTF-16", head: ResponseHead{Status: 200, ContentType: "text/event-stream; charset=utf-16le"},
			content: utf16LE("data: " + listing + "\n\n"), want: []string{malformed}, withheld: 1, whole: true},
		{name: "events as text/plain", head: ResponseHead{Status: 200, ContentType: "text/plain"},
			content: "data: " + listing + "\n\n", want: []string{malformed}, withheld: 1, whole: true, notIncluded: "ghost"},
		{name: "events with no content type", head: ResponseHead{Status: 200},
			content: "data: " + listing + "\n\n", want: []string{malformed}, withheld: 1, whole: true, notIncluded: "ghost"},
		// The answer to a request with an id: the error in its place
		// answers that id, so that the client takes it for its answer.
		{name: "a call's answer withheld whole", head: ResponseHead{Status: 200, ContentType: "text/plain", ID: json.RawMessage(`"call-9"`)},
			content: "data: " + listing + "\n\n", want: []string{strings.Replace(malformed, `"id":null`, `"id":"call-9"`, 1)}, withheld: 1, whole: true, notIncluded: "ghost"},
		{name: "a call's compressed answer", head: ResponseHead{Status: 200, ContentType: jsonHead, ContentEncoding: "br", ID: json.RawMessage(`12`)}, content: "\x1f",
			want: []string{strings.Replace(malformed, `"id":null`, `"id":12`, 1)}, withheld: 1, whole: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			r := f.Screen("billing", tt.head, []byte(tt.content))
			got := r.Content
			if r.Whole != tt.whole || r.Withheld != tt.withheld {
				t.Errorf("whole %v, withheld %d; want %v, %d", r.Whole, r.Withheld, tt.whole, tt.withheld)
			}
			if tt.want == nil {
				if string(got) != tt.content {
					t.Fatalf("changed:\n%s\nwas\n%s", got, tt.content)
				}
			}
			rest := string(got)
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("result %s\nlacks %s", got, w)
				}
				rest = rest[i+len(w):]
			}
			if tt.notIncluded != "" && bytes.Contains(got, []byte(tt.notIncluded)) {
				t.Errorf("result %s still holds %s", got, tt.notIncluded)
			}
			reason := deny.ListingUnbound
			if tt.whole {
				reason = deny.MalformedResponse
			}
			if n := testutil.ToFloat64(f.metrics.deliveries.WithLabelValues("billing", string(reason))); int(n) != tt.withheld {
				t.Errorf("deliveries_total{billing,%s} = %v, want %d", reason, n, tt.withheld)
			}
			lines := 0
			for _, l := range bytes.Split(bytes.TrimSpace(f.audit.Bytes()), []byte("\n")) {
				var m map[string]any
				if len(l) == 0 {
					continue
				}
				if err := json.Unmarshal(l, &m); err != nil {
					t.Fatalf("audit line %s: %v", l, err)
				}
				if m["reason"] == string(reason) && m["decision"] == "deny" && m["server_id"] == "billing" && m["phase"] == "response" {
					lines++
				}
			}
			if lines != tt.withheld {
				t.Errorf("%d %s audit lines, want %d:\n%s", lines, reason, tt.withheld, f.audit.Bytes())
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

// Every answer that passes is counted once as screened, by its server (an
// unknown one under "unknown"), and one cut off while held back whole as
// unfinished; neither is the passed of a listing's own answer.
func TestPassedIsCounted(t *testing.T) {
	f := newFixture(t)
	f.Passed("billing", true)
	f.Passed("billing", true)
	f.Passed("elsewhere", true)
	f.Passed("billing", false)
	for _, c := range []struct {
		server, result string
		want           float64
	}{{"billing", "screened", 2}, {"unknown", "screened", 1}, {"billing", "unfinished", 1}, {"payments", "screened", 0}, {"billing", "passed", 0}} {
		if got := testutil.ToFloat64(f.metrics.deliveries.WithLabelValues(c.server, c.result)); got != c.want {
			t.Errorf("deliveries_total{%s,%s} = %v, want %v", c.server, c.result, got, c.want)
		}
	}
}

// An event over the bound is withheld whole, as one error event of the
// stream; a JSON body by the error in its place; any other framing whole.
// Each is counted and audited malformed_response.
func TestOversized(t *testing.T) {
	for _, c := range []struct {
		ct, prefix string
		whole      bool
	}{
		{"text/event-stream", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-31000,", false},
		{"application/json", "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-31000,", false},
		{"text/plain", "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-31000,", true},
		// The answer to a request with an id: the error answers it.
		{"application/json; id", "{\"jsonrpc\":\"2.0\",\"id\":5,\"error\":{\"code\":-31000,", false},
		{"text/event-stream; id", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":5,\"error\":{\"code\":-31000,", false},
	} {
		f := newFixture(t)
		head := ResponseHead{Status: 200, ContentType: c.ct}
		if ct, ok := strings.CutSuffix(c.ct, "; id"); ok {
			head.ContentType, head.ID = ct, json.RawMessage(`5`)
		}
		r := f.Oversized("billing", head)
		if !strings.HasPrefix(string(r.Content), c.prefix) || r.Whole != c.whole || r.Withheld != 1 || !strings.Contains(string(r.Content), "max_response_bytes") {
			t.Errorf("%s: %+v", c.ct, r)
		}
		if got := testutil.ToFloat64(f.metrics.deliveries.WithLabelValues("billing", string(deny.MalformedResponse))); got != 1 {
			t.Errorf("%s: malformed_response counted %v", c.ct, got)
		}
	}
	f := newFixture(t, observeBilling)
	if r := f.Oversized("billing", ResponseHead{Status: 200, ContentType: "text/event-stream"}); !r.Observed || r.Withheld != 1 || r.Content != nil {
		t.Errorf("observed: %+v, want nothing withheld and the withholding counted", r)
	}
}
