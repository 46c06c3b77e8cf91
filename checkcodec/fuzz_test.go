package checkcodec

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// FuzzDecode holds Decode to protobuf-go, the oracle, over arbitrary
// bytes: both refuse them, or both accept them and Decode gives every
// field the decision reads proto.Unmarshal's value, and sets no other.
// The seeds are CheckRequests as Envoy sends them and the shapes that
// test the rules: occurrences to merge, unknown fields and groups, a read
// field in another wire type, nested Structs.
func FuzzDecode(f *testing.F) {
	bench, envoy := marshal(f, benchRequest()), marshal(f, envoyRequest())
	for _, seed := range [][]byte{
		bench, envoy, marshal(f, stringBody()), marshal(f, get()),
		cat(bench, envoy),
		cat(source(str(fPeerPrincipal, "a")), source(str(fPeerPrincipal, "b"))),
		http(msg(fHeaders, entry("x-capsnap-epoch", "a")), msg(fHeaders, str(2, "b"), str(1, "x-capsnap-epoch"), varint(3, 1))),
		http(str(fRawBody, "{}"), str(fBody, "[]"), str(fRawBody, "")),
		source(varint(fPeerPrincipal, 1), str(fPeerCertificate, "-----BEGIN")),
		cat(varint(99, 1), attrs(str(99, "x"), msg(fRequest, msg(2, tag(98, protowire.StartGroupType), varint(1, 1), tag(98, protowire.EndGroupType))))),
		attrs(msg(fMetadata, msg(1, str(1, "envoy.filters.http.jwt_authn"), msg(2, nestedStruct(3, msg(1, str(1, "sub"), msg(2, str(3, "spiffe://acme/agent")))))))),
		attrs(msg(fRouteMetadata, msg(1, str(1, "ns"), msg(2, nestedStruct(3, nil)))), msg(fRouteMetadata, msg(2, str(1, "ns"), msg(2, str(1, "type.googleapis.com/x"), str(2, "\xff"))))),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		agree(t, b)
	})
}
