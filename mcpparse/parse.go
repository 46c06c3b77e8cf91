package mcpparse

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/capsnap/capsnap/deny"
)

// Version is an MCP protocol revision, as named in the MCP-Protocol-Version
// header. capsnap speaks exactly these; a request naming any other is
// refused, because the rules for its shape are not known.
type Version string

const (
	// V20250326 allows JSON-RPC batches. It is also what a request that
	// names no version is taken to speak, as the spec prescribes.
	V20250326 Version = "2025-03-26"
	// V20250618 has one message per POST, Mcp-Session-Id and the
	// MCP-Protocol-Version header.
	V20250618 Version = "2025-06-18"
	V20251125 Version = "2025-11-25"
	// V20260728 is stateless and POST only; Mcp-Method and Mcp-Name headers
	// mirror the body, and each request names its version in
	// params._meta[MetaKeyProtocolVersion].
	V20260728 Version = "2026-07-28"
)

// MetaKeyProtocolVersion is the params._meta member in which a 2026-07-28
// request names its protocol version (mcp.MetaKeyProtocolVersion in the Go
// SDK).
const MetaKeyProtocolVersion = "io.modelcontextprotocol/protocolVersion"

// SupportedVersions are the protocol versions capsnap speaks, newest
// first: what an UnsupportedProtocolVersionError offers.
func SupportedVersions() []string {
	return []string{string(V20260728), string(V20251125), string(V20250618), string(V20250326)}
}

func knownVersion(s string) (Version, bool) {
	switch v := Version(s); v {
	case V20250326, V20250618, V20251125, V20260728:
		return v, true
	}
	return "", false
}

// Kind is what a JSON-RPC message is.
type Kind int

const (
	// KindRequest is a call: it has a method and an id and wants a response.
	KindRequest Kind = iota + 1
	// KindNotification has a method and no id.
	KindNotification
	// KindResponse is a result or error object the client sends back,
	// answering a request the server made of it (elicitation, sampling,
	// roots/list, ping).
	KindResponse
)

func (k Kind) String() string {
	switch k {
	case KindRequest:
		return "request"
	case KindNotification:
		return "notification"
	case KindResponse:
		return "response"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Message is one JSON-RPC message. The raw fields are spans of the body
// given to Parse (not copies): the body must not be modified while the
// Message is in use.
type Message struct {
	Kind Kind
	// ID is the id exactly as sent, a JSON string or integer; nil for a
	// notification. It is what an error response must echo.
	ID     json.RawMessage
	Method string // empty for a response
	// Params is the params object exactly as sent; nil when absent.
	Params json.RawMessage
	// Tool is params.name of a tools/call.
	Tool string
	// Arguments is params.arguments of a tools/call; nil when absent.
	Arguments json.RawMessage
	// Meta is params._meta when present.
	Meta json.RawMessage
	// checked says Arguments are a slice of a body Parse checked.
	checked bool
}

// Request is the content of one HTTP POST.
type Request struct {
	// Version is the protocol version the request speaks: from the
	// MCP-Protocol-Version header; without one, from the body (initialize's
	// params.protocolVersion or params._meta[MetaKeyProtocolVersion]); else
	// V20250326.
	Version Version
	// Batch is set when the body was a JSON-RPC batch (V20250326 only).
	// Messages then holds its elements in order.
	Batch bool
	// Messages are never empty.
	Messages []Message
	// Session is the Mcp-Session-Id header, if any.
	Session string
	// ParamHeaders are the Mcp-Param-* headers, by the lower-case name
	// after ParamHeaderPrefix; nil when there are none. Only a request
	// that is one tools/call may carry them; CheckParamHeaders holds them
	// to its arguments.
	ParamHeaders map[string]string

	// one holds the message of a body that is not a batch, so that the
	// request and its message are one allocation.
	one [1]Message
}

// Limits bound what Parse reads. A zero field takes its default.
type Limits struct {
	// MaxBodyBytes bounds the body; Envoy's max_request_bytes should be no
	// larger, so that Envoy never hands over a truncated body.
	MaxBodyBytes int
	// MaxDepth bounds the nesting of arrays and objects, the outermost
	// object (or batch array) counting as one. It is capped at
	// maxDepthCap.
	MaxDepth int
}

const (
	defaultMaxBodyBytes = 1 << 20
	defaultMaxDepth     = 64
)

// DefaultLimits are the limits a zero Limits (or a zero field) stands for:
// 1 MiB and 64 levels. Parse reads the defaults from constants, so changing
// this variable changes nothing.
var DefaultLimits = Limits{MaxBodyBytes: defaultMaxBodyBytes, MaxDepth: defaultMaxDepth}

// maxDepthCap is the deepest nesting any configuration may allow. The
// checker recurses once per level, and the Go SDK itself refuses documents
// nested deeper than 1000.
const maxDepthCap = 1000

// MaxBatch bounds the number of messages in a batch, so that the work a
// single POST asks of capsnap (and of the server) stays bounded.
const MaxBatch = 64

func (l Limits) orDefault() Limits {
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = defaultMaxBodyBytes
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = defaultMaxDepth
	}
	l.MaxDepth = min(l.MaxDepth, maxDepthCap)
	return l
}

// Parse reads one streamable-HTTP POST: its body and its headers, with
// lower-case names and repeated headers joined by "," as Envoy's
// AttributeContext.HttpRequest delivers them. Every error is a *deny.Error:
// UnsupportedEncoding for a compressed body, UnsupportedMediaType for a body
// not declared as JSON, HeaderMismatch for an MCP header that is malformed,
// names an unknown version or disagrees with the body, and MalformedRequest
// for everything else. When the body was read but disagrees with the
// headers (or batches where its version may not), the Request is returned
// with the error, so that a denial can answer the request's id.
func Parse(body []byte, headers map[string]string, lim Limits) (*Request, error) {
	lim = lim.orDefault()
	if err := checkEntityHeaders(headers, len(body)); err != nil {
		return nil, err
	}
	// A header the body cannot satisfy is refused once the body is read:
	// the refusal then answers the request's own id (an error that names
	// no id is one no client can match to its request).
	headerVer, headerErr := protocolVersionHeader(headers)
	session, hasSession, err := sessionHeader(headers)
	if headerErr == nil {
		headerErr = err
	}
	// The body limit bounds the work of every later pass, and is what a
	// server behind capsnap can be expected to accept too.
	switch {
	case len(body) == 0:
		return nil, deny.Errorf(deny.MalformedRequest, "empty body: a POST must carry a JSON-RPC message")
	case len(body) > lim.MaxBodyBytes:
		return nil, deny.Errorf(deny.MalformedRequest, "body is %d bytes, over the limit of %d", len(body), lim.MaxBodyBytes)
	}
	if err := checkJSON(body, lim.MaxDepth, true); err != nil {
		return nil, deny.Errorf(deny.MalformedRequest, "body is not strict JSON: %v", err)
	}

	r := &Request{Session: session}
	var bodyVer Version
	doc := trimValue(body)
	switch doc[0] {
	case '{':
		m, v, err := readMessage(doc)
		if err != nil && m.ID != nil {
			// The message is refused, but its id was read: the refusal
			// answers it.
			r.one[0] = m
			r.Messages = r.one[:1:1]
			return r, err
		}
		if err != nil {
			return nil, err
		}
		r.one[0] = m
		r.Messages, bodyVer = r.one[:1:1], v
	case '[':
		r.Batch = true
		if bodyVer, err = r.readBatch(doc); err != nil {
			return nil, err
		}
	default:
		return nil, deny.Errorf(deny.MalformedRequest, "body is a JSON %s, not a JSON-RPC message object or batch", jsonType(doc))
	}
	if headerErr != nil {
		return r, headerErr
	}

	// The version the server will apply is the header's; a body that names
	// another one is read under different rules by whoever trusts it.
	switch {
	case headerVer != "" && bodyVer != "" && headerVer != bodyVer:
		return r, deny.Errorf(deny.HeaderMismatch, "mcp-protocol-version header %q disagrees with the body's protocol version %q", headerVer, bodyVer)
	case headerVer != "":
		r.Version = headerVer
	case bodyVer == V20260728:
		// The Go SDK server refuses such a request too; requiring the header
		// keeps every 2026-07-28 request on the header-checked path.
		return r, deny.Errorf(deny.HeaderMismatch, "the body names protocol version %s, which requires the mcp-protocol-version header", V20260728)
	case bodyVer != "":
		r.Version = bodyVer
	default:
		r.Version = V20250326
	}
	// 2025-06-18 removed batching. A server on a later version that reads a
	// batch anyway reads a shape its version does not define: all of it,
	// its first element, or nothing.
	if r.Batch && r.Version != V20250326 {
		return r, deny.Errorf(deny.MalformedRequest, "JSON-RPC batches are allowed only in protocol version %s, not %s", V20250326, r.Version)
	}
	if hasSession && r.Version == V20260728 {
		return r, deny.Errorf(deny.HeaderMismatch, "protocol version %s is stateless: mcp-session-id must not be sent", V20260728)
	}
	if err := checkMirrorHeaders(r, headers); err != nil {
		return r, err
	}
	r.ParamHeaders = paramHeadersOf(headers)
	if r.ParamHeaders != nil && (r.Batch || r.Messages[0].Kind != KindRequest || r.Messages[0].Method != "tools/call") {
		// Refused in every version, as a disagreeing Mcp-Name is: there is
		// no argument for what routes on the header to see.
		return r, deny.Errorf(deny.HeaderMismatch, "mcp-param-* headers mirror the arguments of a tools/call request, and this is not one")
	}
	return r, nil
}

func (r *Request) readBatch(doc []byte) (Version, error) {
	var ver Version
	it := elementsOf(doc)
	for {
		el, ok := it.next()
		if !ok {
			break
		}
		n := len(r.Messages)
		if n == MaxBatch {
			return "", deny.Errorf(deny.MalformedRequest, "batch has more than %d messages", MaxBatch)
		}
		if el[0] != '{' {
			return "", deny.Errorf(deny.MalformedRequest, "batch element %d is a JSON %s, not a message object", n, jsonType(el))
		}
		m, v, err := readMessage(el)
		if err != nil {
			d, _ := deny.As(err)
			return "", deny.Errorf(d.Reason, "batch element %d: %s", n, d.Detail)
		}
		// The spec keeps initialize out of batches: the version that governs
		// the rest of the batch would be decided inside it.
		if m.Method == "initialize" {
			return "", deny.Errorf(deny.MalformedRequest, "batch element %d: initialize must not be part of a batch", n)
		}
		// Answers are matched to calls by id; two calls (or two answers)
		// with one id make the answer to either ambiguous. A call and an
		// answer may share one: the client numbers its calls, the server its
		// own.
		if m.ID != nil {
			for i := range r.Messages {
				if r.Messages[i].Kind == m.Kind && sameID(r.Messages[i].ID, m.ID) {
					return "", deny.Errorf(deny.MalformedRequest, "batch elements %d and %d share the id %s", i, n, excerpt(m.ID))
				}
			}
		}
		if v != "" {
			if ver != "" && v != ver {
				return "", deny.Errorf(deny.MalformedRequest, "batch elements name different protocol versions (%s and %s)", ver, v)
			}
			ver = v
		}
		r.Messages = append(r.Messages, m)
	}
	if len(r.Messages) == 0 {
		return "", deny.Errorf(deny.MalformedRequest, "empty batch")
	}
	return ver, nil
}

// sameID compares two ids as JSON values: integers are spelled canonically
// (checkID), strings may differ in escapes.
func sameID(a, b json.RawMessage) bool {
	if a[0] != '"' || b[0] != '"' {
		return bytes.Equal(a, b)
	}
	return unquote(a) == unquote(b)
}

func jsonType(v []byte) string {
	switch v[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}
