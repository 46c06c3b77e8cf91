package extproc

import (
	"context"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/testbed"
)

// BenchmarkProcessCallAnswer is the ext_proc exchange of one small
// tools/call answer as Envoy makes it in full duplex: a stream, the
// headers, the body in one chunk, and the two answers, through gRPC in
// memory; capsnap's adapter, over a stand-in decision (the recorder), and
// a floor that only passes the answer on. Their difference is what the
// adapter adds; decide's BenchmarkScreen is the screening's own.
func BenchmarkProcessCallAnswer(b *testing.B) {
	for _, c := range []struct {
		name string
		srv  extprocv3.ExternalProcessorServer
	}{{"capsnap", New(passing{&recorder{}}, nil)}, {"floor", floor{}}} {
		b.Run(c.name, func(b *testing.B) { benchmarkProcess(b, c.srv) })
	}
}

// passing is a decision that passes every answer as it is and keeps no
// record of it, so that the benchmark measures the adapter alone.
type passing struct{ *recorder }

func (passing) Screen(_ string, _ decide.ResponseHead, content []byte) decide.Screened {
	return decide.Screened{Content: content}
}

func (passing) Passed(string, bool) {}

// floor answers as little as Envoy takes: the headers unchanged, each
// body chunk sent on as it came.
type floor struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (floor) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		var resps []*extprocv3.ProcessingResponse
		switch r := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			resps = []*extprocv3.ProcessingResponse{passedHeaders()}
		case *extprocv3.ProcessingRequest_ResponseBody:
			resps = streamedBody(r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream())
		}
		for _, r := range resps {
			if err := s.Send(r); err != nil {
				return err
			}
		}
	}
}

func benchmarkProcess(b *testing.B, srv extprocv3.ExternalProcessorServer) {
	conn := testbed.InMemoryGRPC(b, func(gs *grpc.Server) { extprocv3.RegisterExternalProcessorServer(gs, srv) })
	client := extprocv3.NewExternalProcessorClient(conn)
	headers := screenedHeaders(true, false, ":status", "200", "content-type", "application/json", "mcp-session-id", "S-1", "date", "Sun, 06 Dec 2026 02:00:00 GMT")
	body := screenedBody(`{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"Order A-100: delivered, USD 120.00."}]}}`, true)
	b.ReportAllocs()
	for b.Loop() {
		s, err := client.Process(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Send(headers); err != nil {
			b.Fatal(err)
		}
		if err := s.Send(body); err != nil {
			b.Fatal(err)
		}
		for range 2 {
			if _, err := s.Recv(); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.CloseSend(); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Recv(); err == nil {
			b.Fatal("the stream did not end")
		}
	}
}
