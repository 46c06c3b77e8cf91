package checkcodec

import (
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Read lists the CheckRequest fields Decode sets, as paths from
// CheckRequest: the fields package extauthz reads to hand the decision its request. Every other field is
// checked, as protobuf-go checks it, and left unset.
var Read = []string{
	"attributes.source.principal",
	"attributes.request.http.method",
	"attributes.request.http.headers",
	"attributes.request.http.body",
	"attributes.request.http.raw_body",
	"attributes.context_extensions",
	"attributes.metadata_context",
}

// The skipper's tables, from the generated descriptors: the messages
// Decode reads some fields of, whose other fields it checks.
var tables = func() struct{ checkRequest, attributes, peer, request, http *message } {
	seen := map[protoreflect.FullName]*message{}
	var t struct{ checkRequest, attributes, peer, request, http *message }
	t.checkRequest = scan((*authv3.CheckRequest)(nil).ProtoReflect().Descriptor(), seen)
	t.attributes = scan((*authv3.AttributeContext)(nil).ProtoReflect().Descriptor(), seen)
	t.peer = scan((*authv3.AttributeContext_Peer)(nil).ProtoReflect().Descriptor(), seen)
	t.request = scan((*authv3.AttributeContext_Request)(nil).ProtoReflect().Descriptor(), seen)
	t.http = scan((*authv3.AttributeContext_HttpRequest)(nil).ProtoReflect().Descriptor(), seen)
	return t
}()

// Decode parses b, a CheckRequest in protobuf's wire format, into req: the
// fields in Read, with exactly the values proto.Unmarshal gives them, and
// nothing else. It fails exactly where proto.Unmarshal fails: malformed
// wire data anywhere, invalid UTF-8 in any proto3 string, nesting deeper
// than protobuf-go's default limit. Fields it does not read are checked,
// never copied.
func Decode(b []byte, req *authv3.CheckRequest) error {
	req.Reset()
	// The top-level message is the first level of protobuf-go's
	// recursion budget.
	return decodeCheckRequest(b, req, protowire.DefaultRecursionLimit-1)
}

// Each decodeX below reads one message type as protobuf-go does into an
// existing message (a second occurrence of a message field merges into
// the first; a scalar's last occurrence wins; a map entry replaces its
// key's), given the recursion its decoder has left, depth. A field it
// reads, in the wrong wire type, is an unknown field to protobuf-go, and
// so to skipField.

func decodeCheckRequest(b []byte, m *authv3.CheckRequest, depth int) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 || typ == protowire.EndGroupType {
			return errDecode
		}
		b = b[n:]
		var err error
		switch {
		case num == 1 && typ == protowire.BytesType: // attributes
			var v []byte
			if v, n, err = nested(typ, b, depth); err == nil {
				if m.Attributes == nil {
					m.Attributes = new(authv3.AttributeContext)
				}
				err = decodeAttributes(v, m.Attributes, depth-1)
			}
		default:
			n, err = skipField(tables.checkRequest, num, typ, b, depth)
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func decodeAttributes(b []byte, m *authv3.AttributeContext, depth int) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 || typ == protowire.EndGroupType {
			return errDecode
		}
		b = b[n:]
		var err error
		var v []byte
		switch {
		case num == 1 && typ == protowire.BytesType: // source
			if v, n, err = nested(typ, b, depth); err == nil {
				if m.Source == nil {
					m.Source = new(authv3.AttributeContext_Peer)
				}
				err = decodePeer(v, m.Source, depth-1)
			}
		case num == 4 && typ == protowire.BytesType: // request
			if v, n, err = nested(typ, b, depth); err == nil {
				if m.Request == nil {
					m.Request = new(authv3.AttributeContext_Request)
				}
				err = decodeRequest(v, m.Request, depth-1)
			}
		case num == 10 && typ == protowire.BytesType && depth > 0: // context_extensions
			// Out of depth, an entry is skipField's to refuse.
			n, err = decodeStringMap(b, &m.ContextExtensions, 0)
		case num == 11 && typ == protowire.BytesType: // metadata_context
			// Its Structs are protobuf-go's own to decode: a JWT's claims
			// are read from there, and only when the principal is.
			if v, n, err = nested(typ, b, depth); err == nil {
				if m.MetadataContext == nil {
					m.MetadataContext = new(corev3.Metadata)
				}
				// RecursionLimit is the budget of the decoder that meets
				// the field, which Unmarshal spends one of on entering it
				// (and never 0, which would mean the default).
				err = proto.UnmarshalOptions{Merge: true, RecursionLimit: depth}.Unmarshal(v, m.MetadataContext)
			}
		default:
			n, err = skipField(tables.attributes, num, typ, b, depth)
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func decodePeer(b []byte, m *authv3.AttributeContext_Peer, depth int) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 || typ == protowire.EndGroupType {
			return errDecode
		}
		b = b[n:]
		var err error
		switch {
		case num == 4 && typ == protowire.BytesType: // principal
			m.Principal, n, err = consumeString(b)
		default:
			n, err = skipField(tables.peer, num, typ, b, depth)
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func decodeRequest(b []byte, m *authv3.AttributeContext_Request, depth int) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 || typ == protowire.EndGroupType {
			return errDecode
		}
		b = b[n:]
		var err error
		switch {
		case num == 2 && typ == protowire.BytesType: // http
			var v []byte
			if v, n, err = nested(typ, b, depth); err == nil {
				if m.Http == nil {
					m.Http = new(authv3.AttributeContext_HttpRequest)
				}
				err = decodeHTTP(v, m.Http, depth-1)
			}
		default:
			n, err = skipField(tables.request, num, typ, b, depth)
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func decodeHTTP(rest []byte, m *authv3.AttributeContext_HttpRequest, depth int) error {
	for len(rest) > 0 {
		num, typ, n := consumeTag(rest)
		if n < 0 || typ == protowire.EndGroupType {
			return errDecode
		}
		rest = rest[n:]
		var err error
		switch {
		case num == 2 && typ == protowire.BytesType: // method
			m.Method, n, err = consumeString(rest)
		case num == 3 && typ == protowire.BytesType && depth > 0: // headers
			// Out of depth, an entry is skipField's to refuse.
			n, err = decodeStringMap(rest, &m.Headers, 3)
		case num == 11 && typ == protowire.BytesType: // body
			m.Body, n, err = consumeString(rest)
		case num == 12 && typ == protowire.BytesType: // raw_body
			var v []byte
			if v, n = protowire.ConsumeBytes(rest); n < 0 {
				return errDecode
			}
			// A copy: the gRPC buffer rest is in goes back to its pool when
			// Decode returns. An empty one is nil, as protobuf-go leaves
			// a proto3 bytes field.
			m.RawBody = append([]byte(nil), v...)
		default:
			n, err = skipField(tables.http, num, typ, rest, depth)
		}
		if err != nil {
			return err
		}
		rest = rest[n:]
	}
	return nil
}

// consumeString reads a proto3 string field's value at the start of b.
func consumeString(b []byte) (string, int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return "", 0, errDecode
	}
	if !utf8.Valid(v) {
		return "", 0, errUTF8
	}
	return string(v), n, nil
}

// decodeStringMap reads one entry of a map<string, string> field, whose
// bytes start b, into *m. A new map is made with room for this entry and,
// if sibling is not 0, for every later field numbered sibling in b: the
// map's other entries.
func decodeStringMap(b []byte, m *map[string]string, sibling protowire.Number) (int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, errDecode
	}
	var key, val string
	for len(v) > 0 {
		num, typ, k := consumeTag(v)
		if k < 0 {
			return 0, errDecode
		}
		v = v[k:]
		var err error
		switch {
		case num == 1 && typ == protowire.BytesType:
			key, k, err = consumeString(v)
		case num == 2 && typ == protowire.BytesType:
			val, k, err = consumeString(v)
		default:
			k, err = skipUnknown(num, typ, v)
		}
		if err != nil {
			return 0, err
		}
		v = v[k:]
	}
	if *m == nil {
		hint := 0
		if sibling != 0 {
			hint = 1 + count(b[n:], sibling)
		}
		*m = make(map[string]string, hint)
	}
	(*m)[key] = val
	return n, nil
}

// count is how many occurrences of field num the message bytes b hold, as
// far as they can be read: a map's size hint, nothing more.
func count(b []byte, num protowire.Number) int {
	c := 0
	for len(b) > 0 {
		n, _, k := protowire.ConsumeField(b)
		if k < 0 {
			break
		}
		if n == num {
			c++
		}
		b = b[k:]
	}
	return c
}
