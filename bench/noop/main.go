// Command noop is the floor of make bench: an Envoy ext_authz gRPC server
// that allows every Check and does nothing else. It runs on the same gRPC
// library and server options as capsnap, so that the gap between the two
// is the cost of capsnap's decision and nothing of the transport.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/signal"
	"syscall"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9101", "gRPC listen address")
	pprofAddr := flag.String("pprof", "", "if set, serve net/http/pprof on this address (as capsnap's debug.pprof does)")
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
	if err := run(*addr); err != nil {
		fmt.Fprintln(os.Stderr, "noop:", err)
		os.Exit(1)
	}
}

func run(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	// The gRPC server as capsnap's serve runs it, but for its codec:
	// stream workers (see streamWorkers in cmd/capsnap/serve.go).
	gs := grpc.NewServer(grpc.NumStreamWorkers(64))
	authv3.RegisterAuthorizationServer(gs, allowAll{})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	hs.SetServingStatus(authv3.Authorization_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); gs.GracefulStop() }()
	fmt.Fprintf(os.Stderr, "noop: serving ext_authz on %s\n", l.Addr())
	return gs.Serve(l)
}

// allowAll answers every Check with the same, empty OK response.
type allowAll struct {
	authv3.UnimplementedAuthorizationServer
}

// ok is shared: it is never modified, and marshalling only reads it.
var ok = &authv3.CheckResponse{
	Status:       &status.Status{},
	HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}},
}

func (allowAll) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return ok, nil
}
