package mcpparse

import (
	"bytes"
	"strings"
	"unicode"
	"unicode/utf8"
)

// CarriesResult reports whether some client could read body, an HTTP
// response of the given Content-Type and Content-Encoding, as holding a
// JSON-RPC result. Only such a body can deliver tools; any other (an
// error with the request's id, id null or none, a notification, an empty
// body, an HTML page) is the server's own answer, which reaches the client
// as it was sent: an MCP client's recovery depends on it (a 404 "session
// not found", with id null, is how it learns to initialize again).
//
// It errs toward true: a body some client may read as JSON-RPC but that is
// not strict JSON (or a strict event stream) carries a result unless it
// cannot name one for any parser, a body of FramingOther carries one
// unless no client's reading of it can name one (OtherMayName), and a
// compressed one may whenever its type names JSON or an event stream.
// (It reads the answer to a POST: an answer on a GET stream, which the
// TypeScript SDK parses as events whatever its type, is screened by
// decide.Server.Screen.)
func CarriesResult(contentType, contentEncoding string, body []byte, maxDepth int) bool {
	if len(bytes.TrimSpace(body)) == 0 {
		return false
	}
	if Encoded(contentEncoding) {
		// Decompressed by a client that reads the POST's answer as JSON
		// or as an event stream: one whose type names either.
		ct := strings.ToLower(contentType)
		return strings.Contains(ct, "json") || strings.Contains(ct, "event-stream")
	}
	framing := FramingOf(contentType)
	if framing == FramingOther {
		return OtherMayName(contentType, body, "result")
	}
	maxDepth = depthLimit(maxDepth)
	return anyDocument(body, framing == FramingSSE, func(doc []byte) bool { return mayHoldResult(doc, maxDepth) })
}

// mayHoldResult reports whether some parser could read a JSON-RPC result
// in doc, one JSON document: exactly when doc is strict JSON, else
// whenever it could name one (MayName).
func mayHoldResult(doc []byte, maxDepth int) bool {
	if checkJSON(doc, maxDepth, true) != nil {
		return MayName(doc, "result")
	}
	resps, err := responses(trimValue(doc))
	if err != nil {
		return MayName(doc, "result")
	}
	for _, a := range resps {
		if a.result != nil {
			return true
		}
	}
	return false
}

// anyDocument reports whether match holds for some JSON document of body:
// the body itself, or, for an event stream, the data of each event that
// has any. A stream that cannot be split strictly into events is matched
// whole, so that match sees every byte some client could read.
func anyDocument(body []byte, sse bool, match func(doc []byte) bool) bool {
	if !sse {
		return match(body)
	}
	events, err := ReadEventStream(body)
	if err != nil {
		return match(body)
	}
	for _, e := range events {
		if len(bytes.TrimSpace(e.Data)) > 0 && match(e.Data) {
			return true
		}
	}
	return false
}

// MayName reports whether some JSON parser could read a member named name
// (lower-case ASCII) in b, which need not be valid JSON: b holds name up to
// Unicode case folding (Go's encoding/json matches members so: "reſult"
// is "result" to it), or a backslash, with which an escape could spell it.
func MayName(b []byte, name string) bool {
	// Every event of every answer passes here: only a byte that could
	// start the name (its first letter in either case, or any non-ASCII
	// rune, which may fold to it) is looked at further.
	first, upper := name[0], name[0]-'a'+'A'
	for i := 0; i < len(b); {
		switch c := b[i]; {
		case c == '\\':
			return true
		case c >= utf8.RuneSelf:
			if foldedPrefix(b[i:], name) {
				return true
			}
			_, n := utf8.DecodeRune(b[i:])
			i += n
			continue
		case c == first || c == upper:
			if foldedPrefix(b[i:], name) {
				return true
			}
		}
		i++
	}
	return false
}

// foldedPrefix reports whether b starts with name up to case folding.
func foldedPrefix(b []byte, name string) bool {
	for j := 0; j < len(name); j++ {
		if len(b) == 0 {
			return false
		}
		r, n := utf8.DecodeRune(b)
		if asciiFold(r) != name[j] {
			return false
		}
		b = b[n:]
	}
	return true
}

// asciiFold is the lower-case ASCII letter r folds to, or 0 if none.
func asciiFold(r rune) byte {
	if r < utf8.RuneSelf {
		if 'A' <= r && r <= 'Z' {
			r += 'a' - 'A'
		}
		return byte(r)
	}
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		if f < utf8.RuneSelf {
			return asciiFold(f)
		}
	}
	return 0
}

// WithholdListings returns doc, one JSON-RPC document (a message or a
// batch) that is not the answer to a tools/list capsnap admitted, with
// every response some client could take for a tools/list result replaced
// by withhold(id). id is the response's id, or
// null where it has none. A response is a listing when its result is an
// object with a member named tools up to case: a client matches it to its
// pending tools/list by id, whatever stream it came on. A document that
// cannot be read strictly but could name tools for some parser is
// replaced whole, by withhold(null).
func WithholdListings(doc []byte, maxDepth int, withhold func(id []byte) []byte) []byte {
	out, _ := withholdListings(doc, maxDepth, withhold)
	return out
}

// withholdListings is WithholdListings, and how many listings it replaced.
func withholdListings(doc []byte, maxDepth int, withhold func(id []byte) []byte) ([]byte, int) {
	if !MayName(doc, "tools") {
		return doc, 0
	}
	if checkJSON(doc, depthLimit(maxDepth), true) != nil {
		return withhold(jsonNull), 1
	}
	v := trimValue(doc)
	if v[0] != '[' {
		id, listing, err := listingOf(v)
		switch {
		case err != nil:
			return withhold(jsonNull), 1
		case listing:
			return withhold(id), 1
		}
		return doc, 0
	}
	out := []byte{'['}
	n := 0
	it := elementsOf(v)
	for el, ok := it.next(); ok; el, ok = it.next() {
		if len(out) > 1 {
			out = append(out, ',')
		}
		id, listing, err := listingOf(el)
		switch {
		case err != nil:
			return withhold(jsonNull), 1
		case listing:
			out = append(out, withhold(id)...)
			n++
		default:
			out = append(out, el...)
		}
	}
	if n == 0 {
		return doc, 0
	}
	return append(out, ']'), n
}

var jsonNull = []byte("null")

// listingOf reports whether msg, one checked message, is a response some
// client could take for a tools/list result, and its id.
func listingOf(msg []byte) (id []byte, listing bool, err error) {
	resps, err := responses(msg)
	if err != nil || len(resps) == 0 {
		return nil, false, err
	}
	a := &resps[0]
	if a.result == nil || a.result[0] != '{' {
		return nil, false, nil
	}
	listing = a.list.tools != nil
	for _, m := range a.list.members {
		var buf [64]byte
		listing = listing || bytes.EqualFold(nameOf(&buf, m.name), []byte("tools"))
	}
	if id = a.id; id == nil {
		id = jsonNull
	}
	return id, listing, nil
}

// WithholdEventListings is WithholdListings for each event of body, whole
// events of a text/event-stream response: an event that holds a listing
// gets withhold's error as its data instead. A body that is not a strict
// event stream (a lone CR, an event with no blank line after it) but could
// name tools is replaced whole, by one event with withhold(null).
func WithholdEventListings(body []byte, maxDepth int, withhold func(id []byte) []byte) []byte {
	if !MayName(body, "tools") {
		return body
	}
	events, err := ReadEventStream(body)
	if err != nil {
		return MessageEvent(withhold(jsonNull))
	}
	// From the last event back, so that each one's span in body still
	// holds when it is replaced.
	for i := len(events) - 1; i >= 0; i-- {
		e := events[i]
		if len(bytes.TrimSpace(e.Data)) == 0 {
			continue
		}
		if doc, n := withholdListings(e.Data, maxDepth, withhold); n > 0 {
			body = ReplaceData(body, e, doc)
		}
	}
	return body
}

// MessageEvent is msg, one JSON-RPC message on one line, as one event of
// an event stream.
func MessageEvent(msg []byte) []byte {
	out := make([]byte, 0, len(msg)+len("event: message\ndata: \n\n"))
	out = append(out, "event: message\ndata: "...)
	out = append(out, msg...)
	return append(out, "\n\n"...)
}

// CompleteEvents returns the length of the longest prefix of b, the start
// of an event stream, that ends with a blank line: every event in it has
// been dispatched, whatever follows. A line ended by a lone CR is not
// taken for an end, so that an event split by one is held until it is
// read whole.
func CompleteEvents(b []byte) int {
	n := 0
	for pos := 0; ; {
		i := bytes.IndexByte(b[pos:], '\n')
		if i < 0 {
			return n
		}
		line := bytes.TrimSuffix(b[pos:pos+i], []byte("\r"))
		pos += i + 1
		if len(line) == 0 {
			n = pos
		}
	}
}
