package decide

import (
	"bytes"
	"encoding/json"
	"mime"
	"regexp"
	"strings"
	"testing"
	"unicode/utf16"
)

// sdkReadsListing reports whether some official MCP SDK client could read
// a tools/list result in body, an answer of Content-Type ct, reading it
// as each one does (docs/ENVOY.md, "How an answer is framed"), and more
// loosely where that is simpler: a superset of the clients' readings.
//
//   - As JSON: TypeScript when the media type's essence is
//     application/json (a byte order mark dropped), Python when the
//     lower-cased header starts with it, Go by mime.ParseMediaType; the
//     first JSON value, whatever follows it (Go's reader).
//   - As an event stream: TypeScript whatever the type (on the GET stream
//     and a resumed one), Python and Go by their own tests of the type,
//     which are narrower; lines ended at CR, LF or CRLF (TypeScript,
//     Python) or at LF alone (Go); field names with space and any byte
//     order mark trimmed; an event at the end of the stream dispatched
//     (Go); any event type; and the text decoded as UTF-16 where the
//     charset says so (Python).
func sdkReadsListing(ct string, body []byte) bool {
	lower := strings.ToLower(strings.TrimSpace(ct))
	essence, params, _ := mime.ParseMediaType(ct)
	if essence == "application/json" || strings.HasPrefix(lower, "application/json") {
		if jsonListing(bytes.TrimPrefix(body, []byte("\xef\xbb\xbf"))) {
			return true
		}
	}
	texts := [][]byte{body}
	// Python finds a charset as its email package does, RFC 2231's
	// charset* included: every one named is one it may decode by.
	charsets := []string{strings.ToLower(params["charset"])}
	for _, m := range anyCharset.FindAllStringSubmatch(ct, -1) {
		v := strings.ToLower(m[1])
		if _, after, ok := strings.Cut(v, "''"); ok {
			v = after
		}
		charsets = append(charsets, v)
	}
	for _, cs := range charsets {
		switch cs {
		case "", "utf-8", "utf8", "us-ascii", "ascii":
		case "utf-16", "utf-16le":
			texts = append(texts, fuzzUTF16(body, false), fuzzUTF16(body, true))
		case "utf-16be":
			texts = append(texts, fuzzUTF16(body, true))
		default:
			// A codec this model does not have (utf-7, cp037, ...): it
			// may decode to anything.
			return len(bytes.TrimSpace(body)) > 0
		}
	}
	for _, text := range texts {
		for _, anyEnd := range []bool{true, false} {
			for _, data := range looseEvents(text, anyEnd) {
				if jsonListing(data) {
					return true
				}
			}
		}
	}
	return false
}

// anyCharset finds every charset parameter in a Content-Type, however
// the parsers differ on the rest of it.
var anyCharset = regexp.MustCompile(`(?i)charset\*?[ \t]*=[ \t]*"?([^";\s]*)`)

// jsonListing reports whether doc's first JSON value is a response (or a
// batch holding one) whose result is an object with a member named tools,
// names matched in any case as encoding/json matches them.
func jsonListing(doc []byte) bool {
	var v any
	if json.NewDecoder(bytes.NewReader(doc)).Decode(&v) != nil {
		return false
	}
	msgs, ok := v.([]any)
	if !ok {
		msgs = []any{v}
	}
	for _, m := range msgs {
		obj, _ := m.(map[string]any)
		for k, r := range obj {
			result, isObj := r.(map[string]any)
			if !strings.EqualFold(k, "result") || !isObj {
				continue
			}
			for name := range result {
				if strings.EqualFold(name, "tools") {
					return true
				}
			}
		}
	}
	return false
}

// looseEvents is the data of every event some client reads in text.
func looseEvents(text []byte, anyEnd bool) [][]byte {
	var events [][]byte
	var data [][]byte
	open := false
	dispatch := func() {
		if open {
			events = append(events, bytes.Join(data, []byte("\n")))
		}
		data, open = nil, false
	}
	for len(text) > 0 {
		var line []byte
		i := bytes.IndexByte(text, '\n')
		if anyEnd {
			i = bytes.IndexAny(text, "\r\n")
		}
		switch {
		case i < 0:
			line, text = text, nil
		case anyEnd && text[i] == '\r' && i+1 < len(text) && text[i+1] == '\n':
			line, text = text[:i], text[i+2:]
		default:
			line, text = text[:i], text[i+1:]
		}
		// Go's reader ends a line at LF and drops every CR before it.
		line = bytes.TrimRight(line, "\r")
		if len(line) == 0 {
			dispatch()
			continue
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		name = bytes.TrimSpace(bytes.TrimPrefix(bytes.TrimPrefix(name, []byte("\xef\xbb\xbf")), []byte("\u00ef\u00bb\u00bf")))
		if string(name) == "data" {
			// One leading space dropped, as the standard says; all
			// space around it, as Go's reader trims it (an NBSP too).
			if anyEnd {
				value = bytes.TrimPrefix(value, []byte(" "))
			} else {
				value = bytes.TrimSpace(value)
			}
			data = append(data, value)
			open = true
		}
	}
	dispatch()
	return events
}

func fuzzUTF16(b []byte, bigEndian bool) []byte {
	u := make([]uint16, len(b)/2)
	for i := range u {
		if bigEndian {
			u[i] = uint16(b[2*i])<<8 | uint16(b[2*i+1])
		} else {
			u[i] = uint16(b[2*i+1])<<8 | uint16(b[2*i])
		}
	}
	return []byte(string(utf16.Decode(u)))
}

// FuzzScreen feeds Screen, the response path of every answer that is not
// a tools/list's own, arbitrary Content-Types and bodies: whatever it
// passes (not withheld whole), no SDK client's reading of it finds a
// tools/list result.
func FuzzScreen(f *testing.F) {
	const listing = `{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"ghost","inputSchema":{"type":"object"}}]}}`
	for _, c := range []struct{ ct, body string }{
		{"application/json", listing},
		{"application/json", `{"jsonrpc":"2.0","id":3,"result":{"content":[]}}`},
		{"text/event-stream", "data: " + listing + "\n\n"},
		{"text/event-stream", "id: 1\r\nevent: message\r\ndata: " + listing + "\r\n\r\n"},
		{`application/json; profile="text/event-stream"`, listing},
		{"application/json, text/event-stream", listing},
		{"text/event-stream; charset=utf-16le", utf16LE("data: " + listing + "\n\n")},
		{"text/plain", "data: " + listing + "\n\n"},
		{"", "data: " + listing},
		{"text/html", "<p>502 Bad Gateway</p>"},
		{"application/jsonp", listing},
		{"text/event-stream", "\u00ef\u00bb\u00bfdata: " + listing + "\n\n"},
		{"text/event-stream", "data: " + listing + "\rdata: x\n\n"},
	} {
		f.Add(c.ct, []byte(c.body))
	}
	fx := newFixture(f, discardAudit)
	f.Fuzz(func(t *testing.T, ct string, body []byte) {
		r := fx.Screen("billing", ResponseHead{Status: 200, ContentType: ct}, body)
		if r.Whole {
			return
		}
		if sdkReadsListing(ct, r.Content) {
			t.Fatalf("Screen passed, of Content-Type %q:\n%q\nin which an SDK client reads a tools/list result", ct, r.Content)
		}
	})
}

// The model of the clients finds a listing in each way one of them reads
// one: it is what FuzzScreen holds Screen to, so a reading it misses is a
// bypass the fuzz cannot find. (Python's JSON reader also takes NaN,
// which encoding/json here does not; capsnap withholds such a body as not
// strict JSON.)
func TestSDKReadsListing(t *testing.T) {
	const l = `{"jsonrpc":"2.0","id":7,"result":{"tools":[]}}`
	for _, c := range []struct{ why, ct, body string }{
		{"JSON", "application/json", l},
		{"JSON by Python's prefix", "application/jsonp", l},
		{"events", "text/event-stream", "data: " + l + "\n\n"},
		{"events on a GET whatever the type (TypeScript)", "text/plain", "data: " + l + "\n\n"},
		{"a last event with no blank line (Go)", "text/event-stream", "data: " + l},
		{"a blank line of CRs (Go)", "text/event-stream", "data: 1\n\r\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":\r{\"tools\":[]}}\n\n"},
		{"a data value after an NBSP (Go)", "text/event-stream", "data:\u00a0" + l + "\n\n"},
		{"events in UTF-16 (Python)", "text/event-stream; charset=utf-16le", utf16LE("data: " + l + "\n\n")},
		{"a charset* (Python)", "text/event-stream; charset*=utf-7", `data: {"jsonrpc":"2.0","id":7,"result":{"+AHQAbwBvAGwAcw-":[]}}` + "\n\n"},
	} {
		if !sdkReadsListing(c.ct, []byte(c.body)) {
			t.Errorf("%s: the model misses a listing a client reads in %q", c.why, c.body)
		}
	}
	if sdkReadsListing("text/html", []byte("<p>502</p>")) {
		t.Error("the model reads a listing in an HTML page")
	}
}
