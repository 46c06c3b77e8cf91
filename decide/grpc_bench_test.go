package decide

import (
	"context"
	"syscall"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"

	"github.com/capsnap/capsnap/checkcodec"
	"github.com/capsnap/capsnap/testbed"
)

// BenchmarkCheckOverGRPC is the allowed refund through a gRPC server and
// client in this process (an in-memory connection, 64 Checks in flight),
// for capsnap and for a server that allows everything (the floor of make
// bench): what capsnap adds to a Check once gRPC's own work is counted,
// without a second process or the kernel in the figures. capsnap's server
// decodes with checkcodec, as cmd/capsnap's does; capsnap-stock-codec is
// the same server on gRPC's own codec, which the floor keeps.
func BenchmarkCheckOverGRPC(b *testing.B) {
	f := packFixture(b, discardAudit)
	f.list(b, support, "billing", nil)
	f.call(b, argsCall("lookup_order", lookup))
	req := argsCall("refund", `{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`).request()
	codec := grpc.ForceServerCodecV2(checkcodec.Codec{})
	for _, tc := range []struct {
		name string
		srv  authv3.AuthorizationServer
		opts []grpc.ServerOption
	}{{"floor", allowAll{}, nil}, {"capsnap", f.envoy, []grpc.ServerOption{codec}}, {"capsnap-stock-codec", f.envoy, nil}} {
		b.Run(tc.name, func(b *testing.B) {
			client := grpcClient(b, tc.srv, tc.opts...)
			b.ReportAllocs()
			b.SetParallelism(32)
			cpu := cpuTime(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					resp, err := client.Check(ctx, req)
					if err != nil || resp.GetOkResponse() == nil {
						b.Errorf("Check = %v, %v; want allowed", resp, err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is the CPU time this process has used, client, server and
// collector together: on a machine shared with other work, a steadier
// measure of what a Check costs than the time it takes.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// grpcClient serves srv on an in-memory listener, with opts, and dials it.
func grpcClient(b *testing.B, srv authv3.AuthorizationServer, opts ...grpc.ServerOption) authv3.AuthorizationClient {
	return authv3.NewAuthorizationClient(testbed.InMemoryGRPC(b, func(gs *grpc.Server) { authv3.RegisterAuthorizationServer(gs, srv) }, opts...))
}

// allowAll is the floor: it allows every Check and does nothing else.
type allowAll struct {
	authv3.UnimplementedAuthorizationServer
}

var allowed = &authv3.CheckResponse{
	Status:       &rpcstatus.Status{},
	HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}},
}

func (allowAll) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return allowed, nil
}
