package main

import (
	"context"
	"errors"
	"io"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/capsnap/capsnap/testbed"
)

// Only with -decision does the allow leave the decision that
// envoy/demo.yaml's ext_proc filter is matched on.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		resp     *authv3.CheckResponse
		decision string
	}{{ok, ""}, {okWithDecision, "allow"}} {
		got, err := allowAll{resp: tc.resp}.Check(context.Background(), &authv3.CheckRequest{})
		if err != nil || got.GetStatus().GetCode() != 0 || got.GetOkResponse() == nil {
			t.Fatalf("Check: %v, %v", got, err)
		}
		if d := got.GetDynamicMetadata().GetFields()["decision"].GetStringValue(); d != tc.decision {
			t.Errorf("decision %q, want %q", d, tc.decision)
		}
	}
}

// Envoy's messages, and the answers that change nothing.
var (
	headersIn = &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}}
	// continued answers request or response headers, a buffered body or
	// trailers, leaving them as they are.
	continued = map[string]*extprocv3.ProcessingResponse{
		"request headers":  {Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}},
		"request body":     {Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}},
		"request trailers": {Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}},
		"headers":          {Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}},
		"body":             {Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}},
		"trailers":         {Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}},
	}
)

// bodyChunk is Envoy's message with a chunk of the response body, the
// last if end.
func bodyChunk(b string, end bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: end}}}
}

// passedOn is a chunk of a body streamed in full duplex, sent on as it
// came.
func passedOn(b string, end bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte(b), EndOfStream: end},
		}},
	}}}}
}

// Each message is answered with what leaves it as it is, in the form Envoy
// takes in the stream's body mode; the stream ends cleanly when Envoy
// closes it.
func TestPassAll(t *testing.T) {
	const duplex, buffered = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_BUFFERED
	type step struct {
		req  *extprocv3.ProcessingRequest
		want *extprocv3.ProcessingResponse
	}
	for _, tc := range []struct {
		name  string
		mode  extprocfilterv3.ProcessingMode_BodySendMode
		steps []step
	}{
		{"full duplex, the request side too", duplex, []step{
			{&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headersIn}}, continued["request headers"]},
			{&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("{}")}}}, continued["request body"]},
			{&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}, continued["request trailers"]},
			{&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headersIn}}, continued["headers"]},
			{bodyChunk("event: message\n", false), passedOn("event: message\n", false)},
			{bodyChunk("data: {}\n\n", true), passedOn("data: {}\n\n", true)},
		}},
		{"full duplex, the body ended by trailers", duplex, []step{
			{&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headersIn}}, continued["headers"]},
			{bodyChunk(`{"jsonrpc":"2.0"}`, false), passedOn(`{"jsonrpc":"2.0"}`, false)},
			{&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}, continued["trailers"]},
		}},
		{"buffered", buffered, []step{
			{&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headersIn}}, continued["headers"]},
			{bodyChunk(`{"jsonrpc":"2.0"}`, true), continued["body"]},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := testbed.InMemoryGRPC(t, func(gs *grpc.Server) { extprocv3.RegisterExternalProcessorServer(gs, passAll{}) })
			s, err := extprocv3.NewExternalProcessorClient(conn).Process(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tc.steps {
				if i == 0 {
					// Envoy says how it sends bodies on the first message.
					st.req.ProtocolConfig = &extprocv3.ProtocolConfiguration{ResponseBodyMode: tc.mode}
				}
				if err := s.Send(st.req); err != nil {
					t.Fatal(err)
				}
				got, err := s.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(got, st.want) {
					t.Errorf("step %d: got %v, want %v", i, got, st.want)
				}
			}
			if err := s.CloseSend(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Recv(); !errors.Is(err, io.EOF) {
				t.Errorf("after Envoy closed the stream: %v, want io.EOF", err)
			}
		})
	}
}
