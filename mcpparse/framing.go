package mcpparse

import (
	"bytes"
	"mime"
	"regexp"
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
// API joins it). Only two spellings are read as every client reads them:
// application/json or text/event-stream (in any letter case), with at
// most the parameter charset=utf-8 (quoted or not, utf8 too), and nothing
// else. The clients parse parameters each their own way (Go's
// mime.ParseMediaType drops an RFC 2231 "charset*" it cannot decode, which
// Python's email parser reads and decodes the body by), so any other
// parameter, any other spelling, is FramingOther.
func FramingOf(contentType string) Framing {
	// What servers send, read on every answer without a parse.
	switch contentType {
	case "application/json":
		return FramingJSON
	case "text/event-stream":
		return FramingSSE
	}
	m := plainType.FindStringSubmatch(contentType)
	if m == nil {
		return FramingOther
	}
	if strings.EqualFold(m[1], "application/json") {
		return FramingJSON
	}
	return FramingSSE
}

// plainType is the grammar of the two Content-Types FramingOf reads as
// they are: a media type, then at most one parameter, charset=utf-8.
var plainType = regexp.MustCompile(`(?i)^[ \t]*(application/json|text/event-stream)[ \t]*(?:;[ \t]*charset[ \t]*=[ \t]*(?:utf-?8|"utf-?8")[ \t]*)?;?[ \t]*$`)

// OtherMayName reports whether some client could read a member named name
// (lower-case ASCII, as MayName) in body, an answer of FramingOther with
// the given Content-Type: as one JSON document when the type names JSON
// anywhere; as an event stream always (lines ended by CR, LF or CRLF, as
// the TypeScript and Python SDKs split them, or by LF alone, as the Go
// SDK does; a field any client takes for data, dataField); and each of
// those in the bytes as they are and as decoded by the type's charset. A
// charset capsnap cannot decode, or cannot tell for certain, leaves it
// unable to say, so any body but a blank one may name anything.
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
		if asJSON && jsonMayName(text, name) {
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
// decode, and for a header whose charset it cannot tell for certain: one
// that names a charset more than once or in another form (RFC 2231's
// "charset*", a charset inside another parameter) or does not parse,
// where the clients' parsers may each find another one.
func decodings(contentType string, body []byte) (texts [][]byte, ok bool) {
	charset := ""
	if n := strings.Count(strings.ToLower(contentType), "charset"); n > 0 {
		_, params, err := mime.ParseMediaType(contentType)
		v, named := params["charset"]
		if n > 1 || err != nil || !named || strings.Contains(contentType, "*") {
			return nil, false
		}
		charset = strings.ToLower(strings.TrimSpace(v))
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

// dataField reports whether some client takes field for "data": in any
// letter case, after a byte order mark, or one mis-decoded as "ï»¿" (which
// the TypeScript SDK's parser drops), and with space around it (which
// Go's trims).
func dataField(field []byte) bool {
	for {
		switch {
		case bytes.HasPrefix(field, []byte("\xef\xbb\xbf")):
			field = field[3:]
		case bytes.HasPrefix(field, []byte("\u00ef\u00bb\u00bf")):
			field = field[6:]
		default:
			return bytes.EqualFold(bytes.TrimSpace(field), []byte("data"))
		}
	}
}

// jsonMayName reports whether some client's JSON reading of doc could
// find name: a member "tools" of a response's result (a listing, as
// WithholdListings finds one), or a response's "result" (as CarriesResult
// finds one). A doc that is strict JSON is read exactly, so a server's
// problem+json error passes; any other by MayName.
func jsonMayName(doc []byte, name string) bool {
	if name == "tools" {
		_, n := withholdListings(doc, 0, func([]byte) []byte { return nil })
		return n > 0
	}
	return mayHoldResult(doc, depthLimit(0))
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
// at LF alone; a field is data as dataField says. Each name a JSON parser
// reads in an event's data lies within one data line (JSON allows no line
// break inside a string), so data lines are looked at one by one.
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
		if dataField(field) && MayName(value, name) {
			return true
		}
	}
	return false
}
