package mcpparse

import "github.com/capsnap/capsnap/deny"

// Reading a message's params: the members capsnap decides on, and the
// protocol version they name.

// paramsMembers are the params members capsnap reads. Others are the
// method's business, but one that equals any of these up to case would be
// read in its place by an encoding/json server.
var paramsMembers = []string{"name", "arguments", "_meta", "uri", "protocolVersion"}

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
			e := deny.Errorf(deny.MalformedRequest, "params._meta names protocol version %s, which capsnap does not speak", excerpt(s))
			e.UnsupportedVersion = s
			return "", e
		}
		return ver, nil
	}
}
