// Command noop is the floor of make bench: an Envoy ext_authz gRPC server
// that allows every Check, and an ext_proc server that passes every answer
// on unchanged, and nothing else. It runs on the same gRPC library and
// server options as capsnap, so that the gap between the two is the cost
// of capsnap's decisions and nothing of the transport.
//
// By default its allow leaves nothing in Envoy's metadata, so that
// envoy/demo.yaml's Envoy skips its ext_proc filter: the ext_authz floor.
// With -decision it leaves a decision there, as capsnap's allow does, and
// the same Envoy sends every answer through its ext_proc service as it
// does capsnap's: the ext_authz + ext_proc floor.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/signal"
	"syscall"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9101", "gRPC listen address")
	pprofAddr := flag.String("pprof", "", "if set, serve net/http/pprof on this address (as capsnap's debug.pprof does)")
	decision := flag.Bool("decision", false, "leave decision: allow in Envoy's ext_authz metadata, as capsnap's allow does, so that envoy/demo.yaml's ext_proc filter runs on every answer")
	flag.Parse()
	if *pprofAddr != "" {
		pl, err := net.Listen("tcp", *pprofAddr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "noop:", err)
			os.Exit(1)
		}
		// net/http/pprof registered itself on the default mux.
		go func() { _ = http.Serve(pl, nil) }()
	}
	resp := ok
	if *decision {
		resp = okWithDecision
	}
	if err := run(*addr, resp); err != nil {
		fmt.Fprintln(os.Stderr, "noop:", err)
		os.Exit(1)
	}
}

func run(addr string, resp *authv3.CheckResponse) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	// The gRPC server as capsnap's serve runs it, but for its codec:
	// stream workers (see streamWorkers in cmd/capsnap/serve.go).
	gs := grpc.NewServer(grpc.NumStreamWorkers(64))
	authv3.RegisterAuthorizationServer(gs, allowAll{resp: resp})
	extprocv3.RegisterExternalProcessorServer(gs, passAll{})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	for _, svc := range []string{authv3.Authorization_ServiceDesc.ServiceName, extprocv3.ExternalProcessor_ServiceDesc.ServiceName} {
		hs.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); gs.GracefulStop() }()
	fmt.Fprintf(os.Stderr, "noop: serving ext_authz and ext_proc on %s\n", l.Addr())
	return gs.Serve(l)
}

// allowAll answers every Check with the same OK response.
type allowAll struct {
	authv3.UnimplementedAuthorizationServer
	resp *authv3.CheckResponse
}

// ok and okWithDecision are shared: they are never modified, and
// marshalling only reads them.
var (
	ok = &authv3.CheckResponse{
		Status:       &rpcstatus.Status{},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}},
	}
	// okWithDecision carries the one key of capsnap's metadata that
	// envoy/demo.yaml's ext_proc filter is matched on.
	okWithDecision = &authv3.CheckResponse{
		Status:       &rpcstatus.Status{},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"decision": structpb.NewStringValue("allow"),
		}},
	}
)

func (a allowAll) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return a.resp, nil
}

// passAll answers every ext_proc message with the answer that changes
// nothing, in the form Envoy takes for it: a body streamed in full duplex
// goes back chunk by chunk, as it came, each chunk a streamed response
// (all Envoy takes in that mode); a buffered one is answered with an empty
// body response, which leaves it as it is.
type passAll struct {
	extprocv3.UnimplementedExternalProcessorServer
}

// The answers that change nothing, shared as ok is.
var (
	requestHeaders   = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	requestBody      = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
	requestTrailers  = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	responseHeaders  = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	responseBody     = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
	responseTrailers = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
)

// Process serves one HTTP request's stream of processing messages.
func (passAll) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	var duplex bool
	for {
		req, err := stream.Recv()
		// Envoy ends a stream by cancelling it once it has the last answer
		// it needs.
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return err
		}
		if pc := req.GetProtocolConfig(); pc != nil {
			// Envoy says on a stream's first message how it sends bodies.
			duplex = pc.GetResponseBodyMode() == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		var resp *extprocv3.ProcessingResponse
		switch r := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			resp = requestHeaders
		case *extprocv3.ProcessingRequest_RequestBody:
			resp = requestBody
		case *extprocv3.ProcessingRequest_RequestTrailers:
			resp = requestTrailers
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			resp = responseHeaders
		case *extprocv3.ProcessingRequest_ResponseBody:
			resp = responseBody
			if duplex {
				resp = streamed(r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream())
			}
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			resp = responseTrailers
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// streamed sends a chunk of a body streamed in full duplex on as it came.
func streamed(chunk []byte, end bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: end},
		}},
	}}}}
}
