package mcpparse

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

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
	headerVer, err := protocolVersionHeader(headers)
	if err != nil {
		return nil, err
	}
	session, hasSession, err := sessionHeader(headers)
	if err != nil {
		return nil, err
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

// messageMembers are the members of a JSON-RPC 2.0 message object. Any
// other member is refused: JSON-RPC defines none, so one could only be
// something a lenient server reads and capsnap does not, such as one of
// these in another letter case, which encoding/json takes for the member.
var messageMembers = []string{"jsonrpc", "id", "method", "params", "result", "error"}

// paramsMembers are the params members capsnap reads. Others are the
// method's business, but one that equals any of these up to case would be
// read in its place by an encoding/json server.
var paramsMembers = []string{"name", "arguments", "_meta", "uri", "protocolVersion"}

// caseVariant returns the governing name that name equals only up to case.
func caseVariant(name []byte, governing []string) (string, bool) {
	for _, g := range governing {
		if bytes.EqualFold(name, []byte(g)) && string(name) != g {
			return g, true
		}
	}
	return "", false
}

func malformed(format string, args ...any) error {
	return deny.Errorf(deny.MalformedRequest, format, args...)
}

// readMessage reads one checked message object, returning the protocol
// version its body names, if any.
func readMessage(obj []byte) (Message, Version, error) {
	var (
		m                                       Message
		jsonrpc, id, method, params, res, rpErr []byte
	)
	it := membersOf(obj)
	for {
		name, v, ok := it.next()
		if !ok {
			break
		}
		var buf [64]byte
		switch key := nameOf(&buf, name); string(key) {
		case "jsonrpc":
			jsonrpc = v
		case "id":
			id = v
		case "method":
			method = v
		case "params":
			params = v
		case "result":
			res = v
		case "error":
			rpErr = v
		default:
			if g, ok := caseVariant(key, messageMembers); ok {
				return m, "", malformed("member %s is %q in another letter case", excerpt(key), g)
			}
			return m, "", malformed("unknown JSON-RPC member %s", excerpt(key))
		}
	}

	// Some servers ignore the version tag and others (the Go SDK) refuse a
	// message without it; refusing it here keeps both in step.
	if jsonrpc == nil || jsonrpc[0] != '"' || !stringIs(jsonrpc, "2.0") {
		return m, "", malformed(`"jsonrpc" must be the string "2.0"`)
	}
	if id != nil {
		if err := checkID(id); err != nil {
			return m, "", err
		}
	}
	switch {
	case method != nil && (res != nil || rpErr != nil):
		// A server sees either a call or a reply here; which one depends on
		// the order in which it looks.
		return m, "", malformed("a message with a method must not have a result or an error")
	case method != nil:
		if method[0] != '"' {
			// The Go SDK reads "method": null as the empty method.
			return m, "", malformed(`"method" must be a string, not a JSON %s`, jsonType(method))
		}
		m.Method = methodName(method)
		if err := checkName("method", m.Method); err != nil {
			return m, "", malformed("%v", err)
		}
		// capsnap verifies methods by exact name; a server that matched
		// them ignoring case would run "Tools/Call" unverified.
		for _, k := range knownMethods {
			if m.Method != k && strings.EqualFold(m.Method, k) {
				return m, "", malformed("method %s is %q in another letter case", excerpt(m.Method), k)
			}
		}
		m.Kind = KindRequest
		switch {
		case id == nil:
			m.Kind = KindNotification
		case id[0] == 'n':
			// The Go SDK takes "id": null for a notification, other
			// parsers for a call: a call capsnap would answer and one the
			// server would not.
			return m, "", malformed(`a request must not have a null id (omit "id" for a notification)`)
		}
	default:
		switch {
		case res == nil && rpErr == nil:
			return m, "", malformed("message has neither a method nor a result or an error")
		case res != nil && rpErr != nil:
			return m, "", malformed("a response must not have both a result and an error")
		case id == nil || id[0] == 'n':
			// JSON-RPC keeps the null id for errors about requests that could
			// not be read, which a client never has to send; the Go SDK
			// refuses it, and what other servers do with it is their own.
			return m, "", malformed("a response must have a string or integer id")
		case params != nil:
			return m, "", malformed("a response must not have params")
		case res != nil && res[0] != '{':
			// Every MCP result is an object.
			return m, "", malformed(`"result" must be an object, not a JSON %s`, jsonType(res))
		}
		if rpErr != nil {
			if err := checkErrorObject(rpErr); err != nil {
				return m, "", err
			}
		}
		m.Kind = KindResponse
	}
	if id != nil {
		m.ID = id
	}
	if params == nil {
		if m.Method == "tools/call" {
			return m, "", malformed("tools/call has no params")
		}
		return m, "", nil
	}
	m.Params = params
	ver, err := readParams(&m, params)
	return m, ver, err
}

// checkID accepts the two id types every JSON-RPC implementation keeps
// apart and round-trips: strings, and safe integers. The Go SDK reads every
// number as a float and truncates it to an integer, so 1.5 is 1, and
// integers beyond 2^53 collide; an id capsnap echoes must be the one the
// server answers.
func checkID(id []byte) error {
	switch id[0] {
	case '"', 'n':
		return nil
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		if problem := integerProblem(id); problem != "" {
			return malformed("id %s %s", excerpt(id), problem)
		}
		return nil
	}
	return malformed("id must be a string or an integer, not a JSON %s", jsonType(id))
}

// integerProblem says why the checked number n is not an integer spelled
// canonically within ±(2^53-1), the range in which every JSON
// implementation reads integers exactly; "" if it is one.
func integerProblem(n []byte) string {
	digits := n
	if digits[0] == '-' {
		digits = digits[1:]
	}
	switch {
	case bytes.ContainsAny(digits, ".eE"):
		return "is not an integer"
	case string(n) == "-0":
		return "is not a canonical integer"
	}
	// 2^53-1 has 16 digits; compare as strings of equal length.
	const maxSafe = "9007199254740991"
	if len(digits) > len(maxSafe) || len(digits) == len(maxSafe) && string(digits) > maxSafe {
		return "is beyond ±(2^53-1), where clients and servers round it differently"
	}
	return ""
}

// checkErrorObject holds a client's error response to the JSON-RPC 2.0
// error object: an integer code, a string message and optional data.
func checkErrorObject(obj []byte) error {
	if obj[0] != '{' {
		return malformed(`"error" must be an object, not a JSON %s`, jsonType(obj))
	}
	var code, message []byte
	it := membersOf(obj)
	for {
		name, v, ok := it.next()
		if !ok {
			break
		}
		var buf [64]byte
		switch key := nameOf(&buf, name); string(key) {
		case "code":
			code = v
		case "message":
			message = v
		case "data":
		default:
			return malformed("unknown member %s in the error object", excerpt(key))
		}
	}
	if code == nil || code[0] != '-' && (code[0] < '0' || code[0] > '9') || integerProblem(code) != "" {
		return malformed(`error object: "code" must be an integer within ±(2^53-1)`)
	}
	if message == nil || message[0] != '"' {
		return malformed(`error object: "message" must be a string`)
	}
	return nil
}

// knownMethods lets the usual method names be returned without allocating.
var knownMethods = []string{
	"tools/call", "tools/list", "initialize", "notifications/initialized",
	"ping", "server/discover", "subscriptions/listen", "prompts/get",
	"prompts/list", "resources/read", "resources/list",
	"resources/templates/list", "completion/complete", "logging/setLevel",
	"notifications/cancelled", "notifications/progress",
	"notifications/roots/list_changed",
}

func methodName(quoted []byte) string {
	var buf [64]byte
	name := nameOf(&buf, quoted)
	for _, k := range knownMethods {
		if string(name) == k {
			return k
		}
	}
	return string(name)
}

// checkName refuses method and tool names that are empty or hold control,
// format (bidi overrides, zero-width) or space characters. Such names are
// policy keys and audit values; a name that prints like another one, or
// that a logger or an HTTP header would cut or trim, is not the name an
// operator reviewed.
func checkName(what, name string) error {
	if name == "" {
		return fmt.Errorf("%s is empty", what)
	}
	for i, r := range name {
		if r > 0x20 && r < 0x7f {
			continue
		}
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || unicode.IsSpace(r) {
			return fmt.Errorf("%s %s has the character %U at byte %d", what, excerpt(name), r, i)
		}
	}
	return nil
}

// readParams reads the params members capsnap needs into m and returns the
// protocol version they name.
func readParams(m *Message, params []byte) (Version, error) {
	if params[0] != '{' {
		// MCP defines every params as an object. A positional array is
		// valid JSON-RPC that servers would bind to their structs each in
		// their own way, if at all.
		return "", malformed(`"params" must be an object, not a JSON %s`, jsonType(params))
	}
	var name, args, meta, uri, protoVer []byte
	it := membersOf(params)
	for {
		key, v, ok := it.next()
		if !ok {
			break
		}
		var buf [64]byte
		switch k := nameOf(&buf, key); string(k) {
		case "name":
			name = v
		case "arguments":
			args = v
		case "_meta":
			meta = v
		case "uri":
			uri = v
		case "protocolVersion":
			protoVer = v
		default:
			if g, ok := caseVariant(k, paramsMembers); ok {
				return "", malformed("params member %s is %q in another letter case", excerpt(k), g)
			}
		}
	}

	var ver Version
	if meta != nil {
		if meta[0] != '{' {
			return "", malformed(`params._meta must be an object, not a JSON %s`, jsonType(meta))
		}
		m.Meta = meta
		v, err := metaVersion(meta)
		if err != nil {
			return "", err
		}
		ver = v
	}

	switch m.Method {
	case "tools/call":
		// A notification is never answered and never checked as a call;
		// a server that runs it anyway would run it unchecked.
		if m.Kind != KindRequest {
			return "", malformed("tools/call must be a request with an id")
		}
		// The name is what the policy and the snapshot are keyed by; a
		// server that coerces a number or null to a name would run a tool
		// capsnap never looked up.
		if name == nil || name[0] != '"' {
			return "", malformed("tools/call params.name must be a string")
		}
		m.Tool = unquote(name)
		if err := checkName("tool name", m.Tool); err != nil {
			return "", malformed("%v", err)
		}
		// The arguments are what the pinned schema and the policy's limits
		// are checked against; in any other shape one side would see no
		// arguments and the other would bind something. null is no
		// arguments to every server (Go's and Python's read none,
		// TypeScript's refuses it), and the Go SDK's client sends it for a
		// nil map.
		if args != nil && string(args) == "null" {
			args = nil
		}
		if args != nil {
			if args[0] != '{' {
				return "", malformed("tools/call params.arguments must be an object, not a JSON %s", jsonType(args))
			}
			m.Arguments, m.checked = args, true
		}
	case "prompts/get":
		if name != nil && name[0] != '"' {
			return "", malformed("prompts/get params.name must be a string")
		}
	case "resources/read":
		if uri != nil && uri[0] != '"' {
			return "", malformed("resources/read params.uri must be a string")
		}
	case "initialize":
		if protoVer != nil {
			if protoVer[0] != '"' {
				return "", malformed("initialize params.protocolVersion must be a string")
			}
			v, ok := knownVersion(unquote(protoVer))
			if !ok {
				return "", malformed("initialize proposes protocol version %s, which capsnap does not speak", excerpt(unquote(protoVer)))
			}
			if ver != "" && ver != v {
				return "", malformed("initialize params.protocolVersion %s disagrees with params._meta's %s", v, ver)
			}
			ver = v
		}
	}
	return ver, nil
}

func metaVersion(meta []byte) (Version, error) {
	it := membersOf(meta)
	for {
		key, v, ok := it.next()
		if !ok {
			return "", nil
		}
		if !stringIs(key, MetaKeyProtocolVersion) {
			continue
		}
		// The Go SDK ignores a non-string version and reads the request as
		// an old-protocol one; others might not.
		if v[0] != '"' {
			return "", malformed("params._meta[%q] must be a string", MetaKeyProtocolVersion)
		}
		s := unquote(v)
		ver, ok := knownVersion(s)
		if !ok {
			return "", malformed("params._meta names protocol version %s, which capsnap does not speak", excerpt(s))
		}
		return ver, nil
	}
}
