package checkcodec

import (
	"context"
	"sync"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/capsnap/capsnap/testbed"
)

// recorder is an Authorization server that keeps the last request it was
// handed.
type recorder struct {
	authv3.UnimplementedAuthorizationServer
	mu   sync.Mutex
	last *authv3.CheckRequest
}

func (r *recorder) Check(_ context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = req
	return &authv3.CheckResponse{Status: &rpcstatus.Status{}}, nil
}

func (r *recorder) take() *authv3.CheckRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	last := r.last
	r.last = nil
	return last
}

// raw sends and receives messages as their wire bytes, so that a test can
// send what no proto.Message marshals to.
type raw struct{}

func (raw) Name() string { return "proto" }
func (raw) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (raw) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// serve starts a gRPC server on Codec, as cmd/capsnap does, with rec and
// a health service, and dials it.
func serve(t *testing.T, rec *recorder) *grpc.ClientConn {
	return testbed.InMemoryGRPC(t, func(gs *grpc.Server) {
		authv3.RegisterAuthorizationServer(gs, rec)
		healthpb.RegisterHealthServer(gs, health.NewServer())
	}, grpc.ForceServerCodecV2(Codec{}))
}

func TestCodecOnAServer(t *testing.T) {
	rec := &recorder{}
	conn := serve(t, rec)
	ctx := context.Background()

	// A Check reaches the handler with the fields the decision reads.
	req := envoyRequest()
	resp, err := authv3.NewAuthorizationClient(conn).Check(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetStatus() == nil {
		t.Errorf("response = %v; want its status", resp)
	}
	if got := rec.take(); !proto.Equal(got, read(req)) {
		t.Errorf("handler got %v; want %v", got, read(req))
	}

	// Another service's messages take gRPC's codec.
	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health Check = %v, %v; want SERVING", hr, err)
	}

	// What protobuf-go refuses never reaches the handler, read field or
	// not.
	for name, b := range map[string][]byte{
		"principal not UTF-8":   source(str(fPeerPrincipal, badUTF8)),
		"certificate not UTF-8": source(str(fPeerCertificate, badUTF8)),
		"truncated":             marshal(t, req)[:100],
	} {
		var out []byte
		err := conn.Invoke(ctx, "/envoy.service.auth.v3.Authorization/Check", &b, &out, grpc.ForceCodecV2(raw{}))
		if status.Code(err) != codes.Internal {
			t.Errorf("%s: Check = %v; want Internal (the request cannot be decoded)", name, err)
		}
		if got := rec.take(); got != nil {
			t.Errorf("%s: the handler got %v", name, got)
		}
	}
}
