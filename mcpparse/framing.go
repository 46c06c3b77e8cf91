package mcpparse

import (
	"bytes"
	"mime"
	"strings"
	"unicode/utf16"
)

// Framing is how the official MCP SDK clients read the body of an HTTP
// answer, decided from its Content-Type as the strictest of them would
// have to: a framing capsnap reads one way and some client another is a
// bypass of the response path, as a parser differential is of the
// request path. docs/ENVOY.md has the table of framings and what capsnap
// does with each.
type Framing uint8

const (
	// FramingJSON is application/json in UTF-8, a type no client reads as
	// anything but one JSON document: read strictly as that.
	FramingJSON Framing = iota + 1
	// FramingSSE is text/event-stream in UTF-8, a type no client reads as
	// anything but an event stream: read strictly, event by event.
	FramingSSE
	// FramingOther is every other Content-Type, none included: a type some
	// client reads as JSON and another as an event stream (the TypeScript
	// SDK looks for "text/event-stream" anywhere in the header, the Python
	// SDK at its start), one in another charset (the Python SDK decodes an
	// event stream by its charset), or one no client names at all, whose
	// body the TypeScript SDK still parses as an event stream on the GET
	// stream and a resumed one. capsnap reads none of them as a client
	// would: such a body passes only when no reading of it can name what
	// is screened for (OtherMayName), and is otherwise withheld whole.
	FramingOther
)

func (f Framing) String() string {
	switch f {
	case FramingJSON:
		return "json"
	case FramingSSE:
		return "sse"
	}
	return "other"
}

// FramingOf is the framing of an answer whose Content-Type header is
// contentType (a header sent twice is read joined by ", ", as the Fetch
// API joins it). The media type's essence is matched case-insensitively,
// its parameters are parsed, and only charset=utf-8 is taken as the
// clients' default; a header that names the other media type anywhere,
// even inside a parameter's value, is one that clients read differently.
func FramingOf(contentType string) Framing {
	// What servers send, read on every answer without a parse.
	switch contentType {
	case "application/json":
		return FramingJSON
	case "text/event-stream":
		return FramingSSE
	}
	lower := strings.ToLower(contentType)
	if strings.Contains(lower, ",") {
		return FramingOther
	}
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return FramingOther
	}
	for k, v := range params {
		if k != "charset" || !utf8Charset(v) {
			return FramingOther
		}
	}
	switch {
	case mt == "application/json" && !strings.Contains(lower, "event-stream"):
		return FramingJSON
	case mt == "text/event-stream" && !strings.Contains(lower, "json"):
		return FramingSSE
	}
	return FramingOther
}

func utf8Charset(v string) bool { return strings.EqualFold(v, "utf-8") || strings.EqualFold(v, "utf8") }

// OtherMayName reports whether some client could read a member named name
// (lower-case ASCII, as MayName) in body, an answer of FramingOther with
// the given Content-Type: as one JSON document when the type names JSON
// anywhere; as an event stream always (lines ended by CR, LF or CRLF, as
// the TypeScript and Python SDKs split them, or by LF alone, as the Go
// SDK does; any field whose name holds "data"); and each of those in the
// bytes as they are and as decoded by the type's charset. A charset
// capsnap cannot decode leaves it unable to say, so any body but a blank
// one may name anything.
//
// It errs toward true, never toward false: what it passes, no client
// reads a name in.
func OtherMayName(contentType string, body []byte, name string) bool {
	if len(bytes.TrimSpace(body)) == 0 {
		return false
	}
	texts, ok := decodings(contentType, body)
	if !ok {
		return true
	}
	asJSON := strings.Contains(strings.ToLower(contentType), "json")
	for _, text := range texts {
		if asJSON && MayName(text, name) {
			return true
		}
		if dataMayName(text, name, true) || dataMayName(text, name, false) {
			return true
		}
	}
	return false
}

// decodings are the texts some client may decode body to under the
// charset contentType names: the bytes as they are (UTF-8, and every
// ASCII-compatible single-byte charset, in which the letters and the
// backslash MayName looks for are the same bytes), and, for UTF-16 or a
// body that looks like it (a byte order mark, a NUL byte), the body
// decoded in both byte orders. ok is false for a charset capsnap cannot
// decode.
func decodings(contentType string, body []byte) (texts [][]byte, ok bool) {
	_, params, err := mime.ParseMediaType(contentType)
	charset := strings.ToLower(strings.TrimSpace(params["charset"]))
	if err != nil {
		// Parameters a client may still find, such as a charset after
		// a malformed one.
		charset = charsetAnywhere(contentType)
	}
	texts = [][]byte{body}
	switch charset {
	case "", "utf-8", "utf8", "us-ascii", "ascii", "iso-8859-1", "latin1", "latin-1", "windows-1252", "cp1252":
		if !bytes.HasPrefix(body, []byte{0xff, 0xfe}) && !bytes.HasPrefix(body, []byte{0xfe, 0xff}) && bytes.IndexByte(body, 0) < 0 {
			return texts, true
		}
	case "utf-16", "utf-16le", "utf-16be", "utf16":
	default:
		return nil, false
	}
	return append(texts, utf16Text(body, false), utf16Text(body, true)), true
}

// charsetAnywhere is the value of the first "charset=" in a Content-Type
// that does not parse, lower-cased; "" if it names none, and a value that
// matches no charset above if it names one in a form capsnap cannot read.
func charsetAnywhere(contentType string) string {
	lower := strings.ToLower(contentType)
	i := strings.Index(lower, "charset")
	if i < 0 {
		return ""
	}
	v := strings.TrimLeft(lower[i+len("charset"):], " \t=\"'")
	if j := strings.IndexAny(v, " \t;,\"'"); j >= 0 {
		v = v[:j]
	}
	if v == "" {
		return "unreadable"
	}
	return v
}

// utf16Text decodes b as UTF-16 in one byte order (a byte order mark is
// read as the character it is, which no name holds), to UTF-8.
func utf16Text(b []byte, bigEndian bool) []byte {
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

// dataMayName reports whether some event-stream reading of text has a
// data line that may name name. Lines end at CR, LF or CRLF (anyEnd) or
// at LF alone; a field is data whatever its case and whatever else its
// name holds (a byte order mark, one mis-decoded as "ï»¿", which the
// TypeScript SDK's parser drops, space, which Go's trims). Each name a JSON parser reads in an event's
// data lies within one data line (JSON allows no line break inside a
// string), so data lines are looked at one by one.
func dataMayName(text []byte, name string, anyEnd bool) bool {
	for len(text) > 0 {
		var line []byte
		i := bytes.IndexByte(text, '\n')
		if anyEnd {
			i = bytes.IndexAny(text, "\r\n")
		}
		if i < 0 {
			line, text = text, nil
		} else {
			line, text = text[:i], text[i+1:]
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		if bytes.Contains(bytes.ToLower(field), []byte("data")) && MayName(value, name) {
			return true
		}
	}
	return false
}
