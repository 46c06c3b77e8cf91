package checkcodec

import (
	"net/url"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

const callBody = `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"refund","arguments":{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}}}`

// benchRequest is the allowed refund make bench sends capsnap with checkload
// (bench/out/check-request.json): what the decision needs, and little else.
func benchRequest() *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Principal: "spiffe://acme/agent/support-refund"},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Id: "bench", Method: "POST", Path: "/mcp", Host: "127.0.0.1", Protocol: "HTTP/1.1",
			Headers: map[string]string{
				":authority": "127.0.0.1", ":method": "POST", ":path": "/mcp",
				"accept": "application/json, text/event-stream", "content-length": "151",
				"content-type": "application/json", "x-capsnap-epoch": "ep_6PBmddCig6Ai565vTczdeg",
				"x-request-id": "bench",
			},
			RawBody: []byte(callBody),
		}},
		ContextExtensions: map[string]string{"server_id": "billing"},
	}}
}

// certificate stands for the URL-encoded PEM of the client certificate
// that Envoy sends with include_peer_certificate (envoy/mtls.yaml).
var certificate = url.QueryEscape("-----BEGIN CERTIFICATE-----\n" + strings.Repeat(strings.Repeat("MIIBszCCAVmgAwIBAgIUQ", 3)+"\n", 16) + "-----END CERTIFICATE-----\n")

// envoyRequest is a CheckRequest as Envoy's ext_authz filter builds one
// for a tools/call under envoy/mtls.yaml and envoy/jwt.yaml together
// (with_request_body, pack_as_bytes, include_peer_certificate,
// metadata_context_namespaces): every field Envoy fills in, read by the
// decision or not.
func envoyRequest() *authv3.CheckRequest {
	payload, err := structpb.NewStruct(map[string]any{
		"iss": "https://issuer.acme.example", "sub": "spiffe://acme/agent/support-refund",
		"aud": []any{"capsnap"}, "exp": 1.7e9, "scope": "billing.refund",
	})
	if err != nil {
		panic(err)
	}
	route, err := structpb.NewStruct(map[string]any{"team": "billing"})
	if err != nil {
		panic(err)
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{
			Address:     socket("127.0.0.1", 53211),
			Principal:   "spiffe://acme/agent/support-refund",
			Certificate: certificate,
		},
		Destination: &authv3.AttributeContext_Peer{
			Address:   socket("127.0.0.1", 10443),
			Principal: "spiffe://acme/envoy",
		},
		Request: &authv3.AttributeContext_Request{
			Time: &timestamppb.Timestamp{Seconds: 1_772_366_400, Nanos: 123_456_000},
			Http: &authv3.AttributeContext_HttpRequest{
				Id: "7302563459233541532", Method: "POST",
				Headers: map[string]string{
					":authority": "127.0.0.1:10443", ":method": "POST", ":path": "/billing/mcp", ":scheme": "https",
					"accept": "application/json, text/event-stream", "content-length": "151",
					"content-type": "application/json", "mcp-protocol-version": "2025-11-25",
					"mcp-session-id": "4f9c2b1e-7a43-4c1d-9e2f-0b8a6d5c3e21", "user-agent": "python-httpx/0.28.1",
					"x-forwarded-proto": "https", "x-request-id": "0d6e6b1c-2f0e-4d9a-8a3c-5b7e9f1a2c4d",
					"authorization": "Bearer eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJzdXBwb3J0In0.c2lnbmF0dXJl",
				},
				Path: "/billing/mcp", Host: "127.0.0.1:10443", Scheme: "https", Protocol: "HTTP/1.1",
				Size: int64(len(callBody)), RawBody: []byte(callBody),
			},
		},
		ContextExtensions: map[string]string{"server_id": "billing"},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			"envoy.filters.http.jwt_authn": {Fields: map[string]*structpb.Value{"jwt_payload": structpb.NewStructValue(payload)}},
		}},
		RouteMetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"acme": route}},
		TlsSession:           &authv3.AttributeContext_TLSSession{Sni: "mcp.acme.example"},
	}}
}

func socket(addr string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// stringBody is benchRequest with its body in the string field, as Envoy
// sends it without pack_as_bytes.
func stringBody() *authv3.CheckRequest {
	req := benchRequest()
	h := req.Attributes.Request.Http
	h.Body, h.RawBody = string(h.RawBody), nil
	return req
}

// get is a GET on the event stream: no body.
func get() *authv3.CheckRequest {
	req := benchRequest()
	h := req.Attributes.Request.Http
	h.Method, h.RawBody = "GET", nil
	h.Headers[":method"] = "GET"
	delete(h.Headers, "content-length")
	return req
}

func marshal(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// read is req's fields that Decode reads (Read), and only those, as a
// CheckRequest: what the decision can see of req. A message that is
// present stays present, even if empty. It is made from Read itself, so
// that a path added there is held to protobuf-go too.
func read(req *authv3.CheckRequest) *authv3.CheckRequest {
	out := &authv3.CheckRequest{}
	for _, path := range Read {
		src, dst := req.ProtoReflect(), out.ProtoReflect()
		names := strings.Split(path, ".")
		for i, name := range names {
			fd := src.Descriptor().Fields().ByName(protoreflect.Name(name))
			if fd == nil {
				panic("checkcodec.Read names no field " + path)
			}
			if !src.Has(fd) {
				break
			}
			if i == len(names)-1 {
				dst.Set(fd, src.Get(fd))
				break
			}
			src, dst = src.Get(fd).Message(), dst.Mutable(fd).Message()
		}
	}
	return out
}
