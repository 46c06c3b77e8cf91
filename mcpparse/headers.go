package mcpparse

import (
	"encoding/base64"
	"mime"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/capsnap/capsnap/deny"
)

// Encoded reports whether a Content-Encoding names a coding other than
// identity: a body capsnap would have to decode to read as its reader will.
func Encoded(contentEncoding string) bool {
	ce := strings.TrimSpace(contentEncoding)
	return ce != "" && !strings.EqualFold(ce, "identity")
}

// checkEntityHeaders makes sure the body Envoy delivered is the whole body,
// in the form the server will read it.
func checkEntityHeaders(h map[string]string, bodyLen int) error {
	// capsnap reads the bytes as they are; a server that decompresses first
	// reads something capsnap never saw.
	if ce := h["content-encoding"]; Encoded(ce) {
		return deny.Errorf(deny.UnsupportedEncoding, "content-encoding %s: capsnap reads only uncompressed bodies", excerpt(strings.TrimSpace(ce)))
	}
	if err := checkContentType(h["content-type"]); err != nil {
		return err
	}
	// Envoy sets this when allow_partial_message let it cut the body at
	// max_request_bytes; a prefix of a message is not the message.
	if strings.EqualFold(h["x-envoy-auth-partial-body"], "true") {
		return deny.Errorf(deny.MalformedRequest, "Envoy delivered a truncated body (set allow_partial_message: false)")
	}
	if cl, ok := h["content-length"]; ok {
		n, err := strconv.ParseUint(cl, 10, 63)
		if err != nil || cl[0] == '+' {
			return deny.Errorf(deny.MalformedRequest, "content-length %s is not a length", excerpt(cl))
		}
		if n != uint64(bodyLen) {
			return deny.Errorf(deny.MalformedRequest, "content-length is %d but Envoy delivered %d bytes: the body checked would not be the body sent", n, bodyLen)
		}
	}
	return nil
}

// checkContentType accepts application/json, optionally with
// charset=utf-8: JSON has no other encoding (RFC 8259 §8.1), and a server
// honouring another charset would decode other text.
func checkContentType(ct string) error {
	if ct == "application/json" {
		return nil
	}
	if ct == "" {
		return deny.Errorf(deny.UnsupportedMediaType, "no content-type: MCP messages are application/json")
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return deny.Errorf(deny.UnsupportedMediaType, "content-type %s is not application/json", excerpt(ct))
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return deny.Errorf(deny.UnsupportedMediaType, "content-type %s: only the parameter charset=utf-8 is accepted", excerpt(ct))
		}
	}
	return nil
}

func protocolVersionHeader(h map[string]string) (Version, error) {
	s, ok := h["mcp-protocol-version"]
	if !ok {
		return "", nil
	}
	v, ok := knownVersion(s)
	if !ok {
		e := deny.Errorf(deny.HeaderMismatch, "mcp-protocol-version %s is not a version capsnap speaks (%s, %s, %s, %s)", excerpt(s), V20250326, V20250618, V20251125, V20260728)
		e.UnsupportedVersion = s
		return "", e
	}
	return v, nil
}

// sessionHeader returns the Mcp-Session-Id header. The spec makes a session
// id visible ASCII; a comma is refused as well, because Envoy joins repeated
// headers with one, and a server reading only the first of them would be in
// another session than the one capsnap checked against.
func sessionHeader(h map[string]string) (string, bool, error) {
	s, ok := h["mcp-session-id"]
	if !ok {
		return "", false, nil
	}
	if s == "" {
		return "", true, deny.Errorf(deny.HeaderMismatch, "mcp-session-id is empty")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e || s[i] == ',' {
			return "", true, deny.Errorf(deny.HeaderMismatch, "mcp-session-id %s has a byte outside visible ASCII, or a comma (repeated header?)", excerpt(s))
		}
	}
	return s, true, nil
}

// SEP-2243 wraps a header value that is not plain printable ASCII as
// "=?base64?" + base64(UTF-8 value) + "?=".
const (
	base64Prefix = "=?base64?"
	base64Suffix = "?="
)

// DecodeHeaderValue decodes an Mcp-Name or Mcp-Param-* header value as the
// SDKs encode it: a value wrapped as =?base64?…?= is the padded standard
// base64 of the real value's UTF-8; any other value is the value itself.
// It reports false for a wrapped value that is not exactly that (another
// alphabet, missing padding, non-zero trailing bits, line breaks, or bytes
// that are not UTF-8), as the Python SDK's server does: such a value is
// read differently by different decoders.
func DecodeHeaderValue(v string) (string, bool) {
	inner, ok := strings.CutPrefix(v, base64Prefix)
	if !ok {
		return v, true
	}
	inner, ok = strings.CutSuffix(inner, base64Suffix)
	if !ok {
		return v, true
	}
	// encoding/base64 skips CR and LF, even when strict.
	if strings.ContainsAny(inner, "\r\n") {
		return "", false
	}
	b, err := base64.StdEncoding.Strict().DecodeString(inner)
	if err != nil || !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}

// checkMirrorHeaders holds Mcp-Method and Mcp-Name to the body. Gateways and
// servers may route and decide on these headers without reading the body,
// so a header that disagrees with the body is refused in every version,
// never taken as a hint; in 2026-07-28, where the spec makes them
// mandatory, their absence is refused too.
func checkMirrorHeaders(r *Request, h map[string]string) error {
	hMethod, hasMethod := h["mcp-method"]
	hName, hasName := h["mcp-name"]
	if r.Batch {
		if hasMethod || hasName {
			return deny.Errorf(deny.HeaderMismatch, "mcp-method and mcp-name cannot mirror a batch")
		}
		return nil
	}
	m := &r.Messages[0]
	required := r.Version == V20260728 && m.Kind == KindRequest
	if m.Kind == KindResponse {
		if hasMethod || hasName {
			return deny.Errorf(deny.HeaderMismatch, "a response has no method or name for mcp-method or mcp-name to mirror")
		}
		return nil
	}

	switch {
	case hasMethod && hMethod != m.Method:
		return deny.Errorf(deny.HeaderMismatch, "mcp-method %s disagrees with the body's method %s", excerpt(hMethod), excerpt(m.Method))
	case !hasMethod && required:
		return deny.Errorf(deny.HeaderMismatch, "protocol version %s requires the mcp-method header", r.Version)
	}

	member := nameMember(m.Method)
	if member == "" {
		if !hasName {
			return nil
		}
		// The spec names no member for other methods; a client that sends
		// Mcp-Name anyway mirrors the one that names something.
		member = "name"
		if _, ok := paramString(m.Params, "name"); !ok {
			member = "uri"
		}
	}
	if !hasName {
		if required {
			return deny.Errorf(deny.HeaderMismatch, "protocol version %s requires the mcp-name header for %s", r.Version, m.Method)
		}
		return nil
	}
	want := m.Tool
	if m.Method != "tools/call" {
		var ok bool
		if want, ok = paramString(m.Params, member); !ok {
			return deny.Errorf(deny.HeaderMismatch, "mcp-name is set but %s has no string params.%s to mirror", excerpt(m.Method), member)
		}
	}
	got, ok := DecodeHeaderValue(hName)
	if !ok {
		return deny.Errorf(deny.HeaderMismatch, "mcp-name %s is not valid =?base64?…?= encoding", excerpt(hName))
	}
	if got != want {
		return deny.Errorf(deny.HeaderMismatch, "mcp-name %s disagrees with the body's params.%s %s", excerpt(got), member, excerpt(want))
	}
	return nil
}

// nameMember is the params member that 2026-07-28's Mcp-Name header
// mirrors for method: name for tools/call and prompts/get, uri for
// resources/read, and none for any other method.
func nameMember(method string) string {
	switch method {
	case "tools/call", "prompts/get":
		return "name"
	case "resources/read":
		return "uri"
	}
	return ""
}

// Name is what 2026-07-28's Mcp-Name header mirrors for m, read from the
// body in every protocol version: the tool of a tools/call, the prompt of
// a prompts/get, the uri of a resources/read; "" for any other method, or
// when the member is absent. Like every string Parse read, it is valid
// UTF-8, bounded only by the body.
func (m *Message) Name() string {
	member := nameMember(m.Method)
	switch {
	case member == "":
		return ""
	case m.Method == "tools/call":
		return m.Tool
	}
	v, _ := paramString(m.Params, member)
	return v
}

// paramString returns the string member key of a checked params object.
func paramString(params []byte, key string) (string, bool) {
	if params == nil {
		return "", false
	}
	v, ok := memberValue(params, key)
	if !ok || v[0] != '"' {
		return "", false
	}
	return unquote(v), true
}

// ParamString returns the string member key of the message's params, such
// as a tools/list's cursor.
func (m *Message) ParamString(key string) (string, bool) { return paramString(m.Params, key) }
