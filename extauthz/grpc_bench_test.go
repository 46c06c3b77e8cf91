package extauthz

import (
	"context"
	"net"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// BenchmarkCheckOverGRPC is the allowed refund through a gRPC server and
// client in this process (an in-memory connection, 64 Checks in flight),
// for capsnap and for a server that allows everything (the floor of make
// bench): what capsnap adds to a Check once gRPC's own work is counted,
// without a second process or the kernel in the figures.
func BenchmarkCheckOverGRPC(b *testing.B) {
	f := packFixture(b, discardAudit)
	f.list(b, support, "billing", nil)
	f.call(b, argsCall("lookup_order", lookup))
	req := argsCall("refund", `{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`).request()
	for _, tc := range []struct {
		name string
		srv  authv3.AuthorizationServer
	}{{"floor", allowAll{}}, {"capsnap", f.Server}} {
		b.Run(tc.name, func(b *testing.B) {
			client := grpcClient(b, tc.srv)
			b.ReportAllocs()
			b.SetParallelism(32)
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
		})
	}
}

// grpcClient serves srv on an in-memory listener and dials it.
func grpcClient(b *testing.B, srv authv3.AuthorizationServer) authv3.AuthorizationClient {
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	authv3.RegisterAuthorizationServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	b.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return authv3.NewAuthorizationClient(conn)
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
