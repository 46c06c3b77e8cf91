package grpcload

import (
	"context"
	"encoding/json"
	"maps"
	"sync/atomic"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/capsnap/capsnap/testbed"
)

// server answers the nth Check (from 1) with answer(n).
type server struct {
	authv3.UnimplementedAuthorizationServer
	n      atomic.Int64
	answer func(n int64) (*authv3.CheckResponse, error)
}

func (s *server) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return s.answer(s.n.Add(1))
}

func allowed() *authv3.CheckResponse {
	return &authv3.CheckResponse{Status: &rpcstatus.Status{}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}}}
}

// denied says so by its status alone, deniedResponse by its denied
// response alone: either is a denial.
func denied() *authv3.CheckResponse {
	return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.PermissionDenied)}}
}

func deniedResponse() *authv3.CheckResponse {
	return &authv3.CheckResponse{Status: &rpcstatus.Status{}, HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{}}}
}

// client is an Authorization client of s, in memory.
func client(t *testing.T, s *server) authv3.AuthorizationClient {
	return authv3.NewAuthorizationClient(testbed.InMemoryGRPC(t, func(gs *grpc.Server) { authv3.RegisterAuthorizationServer(gs, s) }))
}

// everyTenth answers every tenth Check with deny's answer, the others
// allowed.
func everyTenth(deny func() *authv3.CheckResponse) func(int64) (*authv3.CheckResponse, error) {
	return func(n int64) (*authv3.CheckResponse, error) {
		if n%10 == 0 {
			return deny(), nil
		}
		return allowed(), nil
	}
}

func TestGenerate(t *testing.T) {
	for name, tc := range map[string]struct {
		answer func(n int64) (*authv3.CheckResponse, error)
		codes  map[string]int
		errors map[string]int
	}{
		"all allowed": {
			answer: func(int64) (*authv3.CheckResponse, error) { return allowed(), nil },
			codes:  map[string]int{"OK": 50},
		},
		"every tenth denied": {
			answer: everyTenth(denied),
			codes:  map[string]int{"OK": 50},
			errors: map[string]int{Denied: 5},
		},
		"every tenth a denied response": {
			answer: everyTenth(deniedResponse),
			codes:  map[string]int{"OK": 50},
			errors: map[string]int{Denied: 5},
		},
		// OPA-Envoy's allow sets no ok_response when it adds no headers.
		"allowed by status alone": {
			answer: func(int64) (*authv3.CheckResponse, error) {
				return &authv3.CheckResponse{Status: &rpcstatus.Status{}}, nil
			},
			codes: map[string]int{"OK": 50},
		},
		"every fifth failed": {
			answer: func(n int64) (*authv3.CheckResponse, error) {
				if n%5 == 0 {
					return nil, status.Error(codes.Unavailable, "wedged")
				}
				return allowed(), nil
			},
			codes:  map[string]int{"OK": 40, "Unavailable": 10},
			errors: map[string]int{"wedged": 10},
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := &server{answer: tc.answer}
			res := Generate(context.Background(), client(t, s), &authv3.CheckRequest{}, 4, 50, time.Second)
			if len(res.Latencies) != 50 || s.n.Load() != 50 {
				t.Fatalf("%d latencies of %d Checks, want 50", len(res.Latencies), s.n.Load())
			}
			if !maps.Equal(res.Codes, tc.codes) || !maps.Equal(res.Errors, tc.errors) {
				t.Fatalf("codes %v, errors %v; want %v, %v", res.Codes, res.Errors, tc.codes, tc.errors)
			}
			// What the load process writes is what the harness reads.
			b, err := json.Marshal(res)
			if err != nil {
				t.Fatal(err)
			}
			var back Result
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			rep := back.Report()
			if rep.Count != 50 || rep.Total != res.Total || rep.P50 <= 0 || rep.P99 < rep.P50 || rep.Slowest < rep.P99 {
				t.Fatalf("report %+v", rep)
			}
			if (rep.Failed() == nil) != (tc.errors == nil) {
				t.Fatalf("Failed() = %v with errors %v", rep.Failed(), tc.errors)
			}
		})
	}
}

// A run whose context ends stops, and reports only what was made.
func TestGenerateStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{}
	s.answer = func(n int64) (*authv3.CheckResponse, error) {
		if n == 10 {
			cancel()
		}
		return allowed(), nil
	}
	res := Generate(ctx, client(t, s), &authv3.CheckRequest{}, 2, 1_000_000, time.Second)
	if n := len(res.Latencies); n < 10 || n > 20 {
		t.Fatalf("%d requests after a cancel at the 10th", n)
	}
}

func TestPercentilesAndMerge(t *testing.T) {
	var lat []time.Duration
	for i := 100; i >= 1; i-- { // started in any order
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	r := Result{Total: time.Second, Latencies: lat, Codes: map[string]int{"OK": 100}}.Report()
	if r.Count != 100 || r.P50 != 50*time.Millisecond || r.P99 != 99*time.Millisecond ||
		r.Slowest != 100*time.Millisecond || r.Mean != 50500*time.Microsecond || r.RPS != 100 {
		t.Fatalf("report %+v", r)
	}
	m := Merge(r, r)
	if m.Count != 200 || m.P50 != r.P50 || m.P99 != r.P99 || m.Mean != r.Mean || m.Total != 2*r.Total || m.RPS != r.RPS {
		t.Fatalf("merged %+v", m)
	}
}

func TestFailed(t *testing.T) {
	ok := Report{Count: 3, StatusCode: map[string]int{"OK": 3}}
	if err := ok.Failed(); err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]Report{
		"none":      {},
		"denied":    {Count: 3, StatusCode: map[string]int{"OK": 3}, Errors: map[string]int{Denied: 1}},
		"status":    {Count: 3, StatusCode: map[string]int{"OK": 2, "PermissionDenied": 1}},
		"error":     {Count: 3, StatusCode: map[string]int{"OK": 3}, Errors: map[string]int{"boom": 1}},
		"uncounted": {Count: 3, StatusCode: map[string]int{"OK": 2}},
	} {
		if r.Failed() == nil {
			t.Errorf("%s: Failed() = nil", name)
		}
	}
}
