package checkcodec

import (
	"bytes"
	"fmt"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// agree decodes b with proto.Unmarshal, the oracle, and with Decode, and
// fails t unless both refuse it or both accept it with the same fields
// read, and Decode sets no other field. It returns Decode's error.
func agree(t testing.TB, b []byte) error {
	t.Helper()
	var want, got authv3.CheckRequest
	werr := proto.Unmarshal(b, &want)
	gerr := Decode(b, &got)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("proto.Unmarshal: %v; Decode: %v\ninput %s", werr, gerr, short(b))
	}
	if werr != nil {
		return gerr
	}
	if w := read(&want); !proto.Equal(w, &got) {
		t.Fatalf("Decode differs from proto.Unmarshal in the fields it reads:\nwant %v\ngot  %v\ninput %x", prototext.Format(w), prototext.Format(&got), short(b))
	}
	return nil
}

// short is b in hex, cut short if long.
func short(b []byte) string {
	if len(b) > 256 {
		return fmt.Sprintf("%x... (%d bytes)", b[:256], len(b))
	}
	return fmt.Sprintf("%x", b)
}

// Wire-format builders.

func tag(num protowire.Number, typ protowire.Type) []byte {
	return protowire.AppendTag(nil, num, typ)
}

func cat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

// msg is field num holding the concatenation of parts (a message, a
// string, bytes, or a map entry).
func msg(num protowire.Number, parts ...[]byte) []byte {
	return protowire.AppendBytes(tag(num, protowire.BytesType), cat(parts...))
}

func str(num protowire.Number, s string) []byte { return msg(num, []byte(s)) }

func varint(num protowire.Number, v uint64) []byte {
	return protowire.AppendVarint(tag(num, protowire.VarintType), v)
}

// attrs, http and so on wrap fields into a CheckRequest down to where they
// belong.
func attrs(fields ...[]byte) []byte { return msg(1, fields...) }
func source(fields ...[]byte) []byte {
	return attrs(msg(1, fields...))
}
func http(fields ...[]byte) []byte { return attrs(msg(4, msg(2, fields...))) }
func entry(k, v string) []byte     { return cat(str(1, k), str(2, v)) }

const badUTF8 = "caf\xc3"

// The field numbers, from attribute_context.proto.
const (
	fSource, fDestination, fRequest, fContextExtensions, fMetadata, fTLS, fRouteMetadata = 1, 2, 4, 10, 11, 12, 13
	fPeerAddress, fPeerService, fPeerLabels, fPeerPrincipal, fPeerCertificate            = 1, 2, 3, 4, 5
	fMethod, fHeaders, fPath, fSize, fBody, fRawBody, fHeaderMap                         = 2, 3, 4, 9, 11, 12, 13
)

func TestDecodeAgreesWithProtobuf(t *testing.T) {
	bench := marshal(t, benchRequest())
	other := benchRequest()
	other.Attributes.Source.Principal = "spiffe://acme/agent/other"
	other.Attributes.Request.Http.Method = "GET"
	other.Attributes.Request.Http.Headers = map[string]string{"x-request-id": "second", "extra": "1"}
	other.Attributes.Request.Http.RawBody = nil
	other.Attributes.ContextExtensions = map[string]string{"server_id": "payments"}
	overlong := []byte{0x8a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02}

	for _, tc := range []struct {
		name    string
		in      []byte
		wantErr bool
	}{
		{name: "bench", in: bench},
		{name: "envoy", in: marshal(t, envoyRequest())},
		{name: "string body", in: marshal(t, stringBody())},
		{name: "get", in: marshal(t, get())},
		{name: "empty", in: nil},
		{name: "empty attributes", in: attrs()},
		{name: "empty http", in: http()},

		// A message's occurrences merge; a scalar's last wins; a map
		// entry replaces its key's.
		{name: "two requests merge", in: cat(bench, marshal(t, other))},
		{name: "principal twice", in: cat(source(str(fPeerPrincipal, "a")), source(str(fPeerPrincipal, "b")))},
		{name: "principal in one attributes twice", in: attrs(msg(fSource, str(fPeerPrincipal, "a")), msg(fSource, str(fPeerPrincipal, "b")))},
		{name: "raw body twice", in: http(str(fRawBody, "first"), str(fRawBody, "second"))},
		{name: "raw body then empty", in: http(str(fRawBody, "first"), str(fRawBody, ""))},
		{name: "body and raw body", in: http(str(fBody, "text"), str(fRawBody, "bytes"))},
		{name: "header twice", in: http(msg(fHeaders, entry("x-capsnap-epoch", "a")), msg(fHeaders, entry("x-capsnap-epoch", "b")))},
		{name: "entry key twice", in: http(msg(fHeaders, str(1, "a"), str(1, "b"), str(2, "v")))},
		{name: "entry value before key", in: http(msg(fHeaders, str(2, "v"), str(1, "k")))},
		{name: "entry without key", in: http(msg(fHeaders, str(2, "v")))},
		{name: "entry without value", in: http(msg(fHeaders, str(1, "k")))},
		{name: "empty entry", in: http(msg(fHeaders))},
		{name: "entry with unknown field", in: http(msg(fHeaders, str(1, "k"), varint(3, 7), str(2, "v")))},
		{name: "entry key as varint", in: http(msg(fHeaders, varint(1, 5), str(2, "v")))},
		{name: "context extension twice", in: attrs(msg(fContextExtensions, entry("server_id", "billing")), msg(fContextExtensions, entry("server_id", "payments")))},
		{name: "metadata twice", in: cat(marshal(t, envoyRequest()), attrs(msg(fMetadata, msg(1, str(1, "envoy.filters.http.jwt_authn"), msg(2)))))},

		// A read field in another wire type is an unknown field.
		{name: "principal as varint", in: source(varint(fPeerPrincipal, 1))},
		{name: "method as fixed32", in: http(cat(tag(fMethod, protowire.Fixed32Type), []byte{1, 2, 3, 4}))},
		{name: "headers as varint", in: http(varint(fHeaders, 1))},
		{name: "attributes as varint", in: varint(1, 1)},
		{name: "attributes as group", in: cat(tag(1, protowire.StartGroupType), varint(4, 1), tag(1, protowire.EndGroupType))},
		{name: "request as fixed64", in: attrs(cat(tag(fRequest, protowire.Fixed64Type), make([]byte, 8)))},
		{name: "metadata as varint", in: attrs(varint(fMetadata, 1))},
		{name: "size as bytes", in: http(str(fSize, "12"))},

		// Unknown fields of every wire type, anywhere.
		{name: "unknown fields", in: cat(varint(99, 1), attrs(
			str(99, badUTF8),
			msg(fSource, tag(99, protowire.Fixed32Type), []byte{1, 2, 3, 4}),
			msg(fRequest, msg(2,
				tag(99, protowire.Fixed64Type), make([]byte, 8),
				tag(98, protowire.StartGroupType), varint(1, 1), str(2, badUTF8), tag(98, protowire.EndGroupType))),
			msg(fContextExtensions, str(1, "k"), str(99, badUTF8)),
		))},
		{name: "largest field number", in: varint(protowire.MaxValidNumber, 1)},

		// Invalid UTF-8 in a proto3 string, read or not, is refused.
		{name: "principal not UTF-8", in: source(str(fPeerPrincipal, badUTF8)), wantErr: true},
		{name: "method not UTF-8", in: http(str(fMethod, badUTF8)), wantErr: true},
		{name: "body not UTF-8", in: http(str(fBody, badUTF8)), wantErr: true},
		{name: "header name not UTF-8", in: http(msg(fHeaders, entry(badUTF8, "v"))), wantErr: true},
		{name: "header value not UTF-8", in: http(msg(fHeaders, entry("k", badUTF8))), wantErr: true},
		{name: "header key not UTF-8 then replaced", in: http(msg(fHeaders, str(1, badUTF8), str(1, "k"))), wantErr: true},
		{name: "context extension not UTF-8", in: attrs(msg(fContextExtensions, entry("server_id", badUTF8))), wantErr: true},
		{name: "path not UTF-8", in: http(str(fPath, badUTF8)), wantErr: true},
		{name: "certificate not UTF-8", in: source(str(fPeerCertificate, badUTF8)), wantErr: true},
		{name: "peer label not UTF-8", in: source(msg(fPeerLabels, entry("k", badUTF8))), wantErr: true},
		{name: "destination principal not UTF-8", in: attrs(msg(fDestination, str(fPeerPrincipal, badUTF8))), wantErr: true},
		{name: "socket address not UTF-8", in: source(msg(fPeerAddress, msg(1, str(2, badUTF8)))), wantErr: true},
		{name: "sni not UTF-8", in: attrs(msg(fTLS, str(1, badUTF8))), wantErr: true},
		{name: "route metadata key not UTF-8", in: attrs(msg(fRouteMetadata, msg(1, str(1, badUTF8)))), wantErr: true},
		{name: "route metadata value not UTF-8", in: attrs(msg(fRouteMetadata, msg(1, str(1, "ns"), msg(2, msg(1, str(1, "k"), msg(2, str(3, badUTF8))))))), wantErr: true},
		{name: "metadata value not UTF-8", in: attrs(msg(fMetadata, msg(1, str(1, "ns"), msg(2, msg(1, str(1, "k"), msg(2, str(3, badUTF8))))))), wantErr: true},
		{name: "typed metadata type url not UTF-8", in: attrs(msg(fRouteMetadata, msg(2, str(1, "ns"), msg(2, str(1, badUTF8))))), wantErr: true},
		{name: "header map key not UTF-8", in: http(msg(fHeaderMap, msg(1, str(1, badUTF8)))), wantErr: true},
		// ...but bytes are bytes.
		{name: "raw body not UTF-8", in: http(str(fRawBody, badUTF8))},
		{name: "header map raw value not UTF-8", in: http(msg(fHeaderMap, msg(1, str(1, "k"), str(3, badUTF8))))},
		{name: "typed metadata value", in: attrs(msg(fRouteMetadata, msg(2, str(1, "ns"), msg(2, str(1, "type.googleapis.com/x"), str(2, badUTF8)))))},

		// Malformed wire data, read or not, is refused.
		{name: "truncated", in: bench[:len(bench)-1], wantErr: true},
		{name: "length past the end", in: cat(tag(1, protowire.BytesType), []byte{5, 1}), wantErr: true},
		{name: "huge length", in: cat(tag(1, protowire.BytesType), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}), wantErr: true},
		{name: "field number 0", in: varint(0, 1), wantErr: true},
		{name: "field number too large", in: protowire.AppendVarint(protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3), 1), wantErr: true},
		{name: "tag overflows", in: overlong, wantErr: true},
		{name: "wire type 6", in: []byte{0x0e, 0}, wantErr: true},
		{name: "wire type 7", in: attrs([]byte{0x0f}), wantErr: true},
		{name: "end group at top", in: tag(1, protowire.EndGroupType), wantErr: true},
		{name: "end group in attributes", in: attrs(tag(fRequest, protowire.EndGroupType)), wantErr: true},
		{name: "unclosed group", in: http(tag(99, protowire.StartGroupType)), wantErr: true},
		{name: "mismatched group", in: http(tag(99, protowire.StartGroupType), tag(98, protowire.EndGroupType)), wantErr: true},
		{name: "truncated size", in: http(tag(fSize, protowire.VarintType), []byte{0x80}), wantErr: true},
		{name: "truncated principal", in: attrs(msg(fSource, tag(fPeerPrincipal, protowire.BytesType), []byte{3, 'a'})), wantErr: true},
		{name: "truncated unknown fixed64", in: http(tag(99, protowire.Fixed64Type), []byte{1, 2}), wantErr: true},
		{name: "truncated timestamp", in: attrs(msg(fRequest, msg(1, tag(1, protowire.VarintType)))), wantErr: true},
		{name: "entry end group", in: http(msg(fHeaders, str(1, "k"), tag(2, protowire.EndGroupType))), wantErr: true},
		{name: "entry field number 0", in: http(msg(fHeaders, varint(0, 1))), wantErr: true},
		{name: "entry field number too large", in: http(msg(fHeaders, protowire.AppendVarint(protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3), 1))), wantErr: true},
		{name: "entry truncated", in: http(msg(fHeaders, tag(1, protowire.BytesType), []byte{9})), wantErr: true},
		{name: "metadata truncated", in: attrs(msg(fMetadata, msg(1, tag(1, protowire.BytesType)))), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := agree(t, tc.in)
			if (err != nil) != tc.wantErr {
				t.Errorf("Decode: %v; want error %v", err, tc.wantErr)
			}
		})
	}
}

// nestedStruct is a Struct nested n deep, each holding the next under
// "a"; the innermost holds last. Written outside in, in one pass.
func nestedStruct(n int, last []byte) []byte {
	// Struct{fields: {"a": Value{struct_value: inner}}}, and the length
	// of each level's entry, value and inner Struct.
	key := str(1, "a")
	entry, value, inner := make([]int, n+1), make([]int, n+1), make([]int, n+1)
	inner[0] = len(last)
	for i := 1; i <= n; i++ {
		value[i] = len(tag(5, protowire.BytesType)) + protowire.SizeBytes(inner[i-1])
		entry[i] = len(key) + len(tag(2, protowire.BytesType)) + protowire.SizeBytes(value[i])
		inner[i] = len(tag(1, protowire.BytesType)) + protowire.SizeBytes(entry[i])
	}
	b := make([]byte, 0, inner[n])
	for i := n; i >= 1; i-- {
		b = protowire.AppendVarint(protowire.AppendTag(b, 1, protowire.BytesType), uint64(entry[i]))
		b = append(b, key...)
		b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.BytesType), uint64(value[i]))
		b = protowire.AppendVarint(protowire.AppendTag(b, 5, protowire.BytesType), uint64(inner[i-1]))
	}
	return append(b, last...)
}

// TestDecodeDepth nests Structs in the metadata Decode reads (which
// protobuf-go decodes) and in the route metadata it skips, around the
// depth where protobuf-go's recursion limit refuses them, with and without
// a map field in the wrong wire type where the budget runs out (protobuf-go
// counts a map entry before it looks at its wire type).
func TestDecodeDepth(t *testing.T) {
	type variant struct {
		name  string
		field protowire.Number
		last  []byte
	}
	// In the metadata Decode reads, protobuf-go's own decoder meets the
	// limit: Decode need only start it with the right budget.
	variants := []variant{{"metadata", fMetadata, nil}}
	// In the route metadata Decode skips, its own skipper does. There the
	// innermost Struct holds last, under hops Struct-ListValue-Value levels
	// (5 of protobuf-go's, where a Struct's is 3), so that the budget runs
	// out at each of last's levels in one of them.
	for name, last := range map[string][]byte{
		"nothing":       nil,
		"map as varint": varint(1, 1),
		"entry":         msg(1, str(1, "k")),
	} {
		for hops := range 3 {
			in := last
			for range hops {
				// Struct{fields: {"l": Value{list_value: ListValue{values: [Value{struct_value: in}]}}}}
				in = msg(1, str(1, "l"), msg(2, msg(6, msg(1, msg(5, in)))))
			}
			variants = append(variants, variant{fmt.Sprintf("route metadata/%s/%d hops", name, hops), fRouteMetadata, in})
		}
	}
	for _, tc := range variants {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := func(n int) []byte {
				return attrs(msg(tc.field, msg(1, str(1, "ns"), msg(2, nestedStruct(n, tc.last)))))
			}
			// The shallowest nesting protobuf-go refuses: every level is
			// three of its budget (Struct, map entry, Value), so it is
			// just under a third of the budget.
			lo, hi := protowire.DefaultRecursionLimit/3-40, protowire.DefaultRecursionLimit/3+3
			if proto.Unmarshal(in(lo), new(authv3.CheckRequest)) != nil || proto.Unmarshal(in(hi), new(authv3.CheckRequest)) == nil {
				t.Fatalf("protobuf-go's recursion limit is not between nestings %d and %d", lo, hi)
			}
			for lo < hi {
				mid := (lo + hi) / 2
				if proto.Unmarshal(in(mid), new(authv3.CheckRequest)) != nil {
					hi = mid
				} else {
					lo = mid + 1
				}
			}
			for n := lo - 2; n <= lo+1; n++ {
				err := agree(t, in(n))
				if (err != nil) != (n >= lo) {
					t.Errorf("nesting %d: Decode: %v", n, err)
				}
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, tc := range []struct {
		name string
		req  *authv3.CheckRequest
	}{{"bench", benchRequest()}, {"envoy", envoyRequest()}} {
		in := marshal(b, tc.req)
		b.Run(tc.name+"/protobuf", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var req authv3.CheckRequest
				if err := proto.Unmarshal(in, &req); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"/checkcodec", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var req authv3.CheckRequest
				if err := Decode(in, &req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
