package mcpparse

import (
	"bytes"
	"fmt"
	"strings"
	"unicode"

	"github.com/capsnap/capsnap/deny"
)

// Reading one JSON-RPC message of a checked body: its members, its kind,
// its id and its method name.

// messageMembers are the members of a JSON-RPC 2.0 message object. Any
// other member is refused: JSON-RPC defines none, so one could only be
// something a lenient server reads and capsnap does not, such as one of
// these in another letter case, which encoding/json takes for the member.
var messageMembers = []string{"jsonrpc", "id", "method", "params", "result", "error"}

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
		// memberErr refuses a member no server reads alike; it is
		// returned once the id is read.
		memberErr error
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
			if memberErr != nil {
				continue
			}
			if g, ok := caseVariant(key, messageMembers); ok {
				memberErr = malformed("member %s is %q in another letter case", excerpt(key), g)
			} else {
				memberErr = malformed("unknown JSON-RPC member %s", excerpt(key))
			}
		}
	}

	// A refusal answers the request's own id whenever the id can be read,
	// as an error must: a client matches an answer to its request by id,
	// and one for id null is one it cannot match (JSON-RPC keeps null for a
	// request whose id could not be read). A response's id is not one the
	// client waits on, so a refused response is answered for no id.
	if id != nil && res == nil && rpErr == nil && id[0] != 'n' && checkID(id) == nil {
		m.ID = id
	}
	if memberErr != nil {
		return m, "", memberErr
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
