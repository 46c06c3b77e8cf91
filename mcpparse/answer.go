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
// cannot name one for any parser, and a compressed one always may.
func CarriesResult(contentType, contentEncoding string, body []byte, maxDepth int) bool {
	if len(bytes.TrimSpace(body)) == 0 {
		return false
	}
	sse, ok := messageMediaType(contentType)
	if !ok {
		return false
	}
	if contentEncoding != "" && !strings.EqualFold(strings.TrimSpace(contentEncoding), "identity") {
		return true
	}
	maxDepth = depthLimit(maxDepth)
	return AnyDocument(body, sse, func(doc []byte) bool {
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
	})
}

// messageMediaType reports whether some MCP client reads a body of this
// Content-Type as JSON-RPC messages, and whether as an event stream. The
// SDKs differ (TypeScript's looks for the media type anywhere in the
// header, Python's at its start), so any mention counts: a header no
// client reads as either is one every client refuses.
func messageMediaType(contentType string) (sse, ok bool) {
	ct := strings.ToLower(contentType)
	sse = strings.Contains(ct, "event-stream")
	return sse, sse || strings.Contains(ct, "json")
}

// AnyDocument reports whether match holds for some JSON document of body:
// the body itself, or, for an event stream, the data of each event that
// has any. A stream that cannot be split strictly into events is matched
// whole, so that match sees every byte some client could read.
func AnyDocument(body []byte, sse bool, match func(doc []byte) bool) bool {
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
	if bytes.IndexByte(b, '\\') >= 0 {
		return true
	}
	for i := 0; i < len(b); {
		if foldedPrefix(b[i:], name) {
			return true
		}
		_, n := utf8.DecodeRune(b[i:])
		i += n
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
