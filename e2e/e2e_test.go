//go:build e2e

// Package e2e runs capsnap behind a real Envoy in front of a real MCP
// server built on the official Go SDK, each a separate process on loopback.
// It is behind the e2e build tag so that plain `go test ./...` needs neither
// Envoy nor the network; `make test` runs it, and there a missing Envoy
// fails the run.
package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/capsnap/capsnap/testbed"
)

const (
	supportAgent  = "spiffe://acme/agent/support-refund"
	readonlyAgent = "spiffe://acme/agent/support-readonly"
)

var bins map[string]string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "capsnap-e2e-bin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		bins, err = testbed.Build(ctx, dir, "github.com/capsnap/capsnap/cmd/capsnap", "github.com/capsnap/capsnap/examples/billing/cmd/billing")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}())
}

// startStack brings up billing, capsnap and Envoy for one test. A missing
// Envoy is a failure, never a skip.
func startStack(t *testing.T) *testbed.Stack {
	t.Helper()
	return startStackWith(t, nil)
}

func startStackWith(t *testing.T, opt func(*testbed.StackOptions)) *testbed.Stack {
	t.Helper()
	envoyBin, err := testbed.FindEnvoy()
	if err != nil {
		t.Fatal(err)
	}
	ports, err := testbed.RandomPorts()
	if err != nil {
		t.Fatal(err)
	}
	policy, err := os.ReadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := testbed.StackOptions{
		Capsnap: bins["capsnap"], Billing: bins["billing"], Envoy: envoyBin,
		Ports: ports, Dir: t.TempDir(), Policy: policy,
	}
	if opt != nil {
		opt(&o)
	}
	s, err := testbed.StartStack(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range []*testbed.Process{s.Envoy, s.Capsnap, s.Billing, s.Payments} {
				t.Logf("--- %s output ---\n%s", p.Name, p.Output())
			}
		}
		s.Close()
	})
	t.Logf("running against %s", s.EnvoyVersion)
	if !strings.Contains(s.EnvoyVersion, "/"+testbed.EnvoyVersionWant+"/") {
		t.Fatalf("Envoy is %q, want %s", s.EnvoyVersion, testbed.EnvoyVersionWant)
	}
	return s
}

// denialReason is capsnap's reason as an MCP SDK client surfaces it.
func denialReason(t *testing.T, err error) string {
	t.Helper()
	var werr *jsonrpc.Error
	if !errors.As(err, &werr) {
		t.Fatalf("error %v is not a JSON-RPC error from capsnap", err)
	}
	if werr.Code != -31000 {
		t.Fatalf("JSON-RPC error code %d, want capsnap's -31000: %v", werr.Code, werr)
	}
	var data struct {
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(werr.Data, &data); err != nil {
		t.Fatalf("error data %s: %v", werr.Data, err)
	}
	return data.Reason
}

func handlerStarts(t *testing.T, s *testbed.Stack, tool string) int {
	t.Helper()
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.HandlerStarts[tool]
}

func TestWalkingSkeleton(t *testing.T) {
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	for _, version := range []string{"2025-06-18", "2025-11-25", "2026-07-28"} {
		t.Run(version, func(t *testing.T) {
			cs, err := testbed.Connect(ctx, s.MCPURL(), supportAgent, version)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			if got := cs.InitializeResult().ProtocolVersion; got != version {
				t.Fatalf("negotiated protocol version %s, want %s", got, version)
			}

			// Discovery passes.
			list, err := cs.ListTools(ctx, nil)
			if err != nil {
				t.Fatalf("tools/list: %v", err)
			}
			if len(list.Tools) < 2 {
				t.Fatalf("tools/list returned %d tools", len(list.Tools))
			}

			// A granted call is allowed and the handler runs once.
			before := handlerStarts(t, s, "lookup_order")
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "lookup_order", Arguments: map[string]any{"order_id": "A-100"}}); err != nil {
				t.Fatalf("lookup_order: %v", err)
			}
			if got := handlerStarts(t, s, "lookup_order"); got != before+1 {
				t.Fatalf("lookup_order handler started %d times, want 1", got-before)
			}

			// A tool absent from the live catalog is denied, and the client
			// surfaces capsnap's reason.
			_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "delete_all_orders", Arguments: map[string]any{}})
			if got := denialReason(t, err); got != "unknown_tool" {
				t.Fatalf("unknown tool: reason %q, want unknown_tool", got)
			}
		})
	}

	t.Run("not granted", func(t *testing.T) {
		cs, err := testbed.Connect(ctx, s.MCPURL(), readonlyAgent, "")
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		if _, err := cs.ListTools(ctx, nil); err != nil {
			t.Fatal(err)
		}
		before := handlerStarts(t, s, "refund")
		_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"}})
		if got := denialReason(t, err); got != "tool_not_granted" {
			t.Fatalf("reason %q, want tool_not_granted", got)
		}
		if got := handlerStarts(t, s, "refund"); got != before {
			t.Fatalf("denied refund started its handler")
		}
	})

	t.Run("malformed body", func(t *testing.T) {
		before := handlerStarts(t, s, "refund")
		// Duplicate "name": a parser that keeps the first key and one that
		// keeps the last would see different tools.
		body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"lookup_order","name":"refund","arguments":{}}}`
		resp, reply := post(t, s, supportAgent, body)
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("x-capsnap-reason") != "malformed_request" {
			t.Fatalf("got %s, x-capsnap-reason %q; want 400 malformed_request", resp.Status, resp.Header.Get("x-capsnap-reason"))
		}
		// A body that does not parse has no trustworthy id: JSON-RPC
		// answers such a request with id null.
		var msg struct {
			ID    json.RawMessage `json:"id"`
			Error struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(reply, &msg); err != nil || string(msg.ID) != "null" || msg.Error.Code != -31000 {
			t.Fatalf("reply %s is not a JSON-RPC error for id null (%v)", reply, err)
		}
		if got := handlerStarts(t, s, "refund"); got != before {
			t.Fatalf("malformed call started a handler")
		}
	})

	t.Run("capsnap down fails closed", func(t *testing.T) {
		cs, err := testbed.Connect(ctx, s.MCPURL(), supportAgent, "")
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		if _, err := cs.ListTools(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Capsnap.Stop(); err != nil {
			t.Fatalf("stop capsnap: %v", err)
		}
		before := handlerStarts(t, s, "lookup_order")
		_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "lookup_order", Arguments: map[string]any{"order_id": "A-100"}})
		if err == nil {
			t.Fatal("call allowed with capsnap down")
		}
		if got := handlerStarts(t, s, "lookup_order"); got != before {
			t.Fatalf("handler started with capsnap down")
		}
		resp, _ := post(t, s, supportAgent, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"lookup_order","arguments":{"order_id":"A-100"}}}`)
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("with capsnap down Envoy answered %s, want 503", resp.Status)
		}
	})
}

// post sends one raw JSON-RPC body through Envoy, as a client that is not an
// SDK might.
func post(t *testing.T, s *testbed.Stack, principal, body string) (*http.Response, []byte) {
	t.Helper()
	return postWith(t, s, principal, body, nil)
}

// postWith is post with extra headers, bounded in time.
func postWith(t *testing.T, s *testbed.Stack, principal, body string, headers map[string]string) (*http.Response, []byte) {
	t.Helper()
	return postTo(t, s.MCPURL(), principal, body, headers)
}

// postTo is postWith to url, which may be a server's own, past Envoy (no
// principal then).
func postTo(t *testing.T, url, principal, body string, headers map[string]string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := testbed.HTTPClient(principal).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// The shipped Envoy configuration is accepted by the real Envoy as it is.
func TestEnvoyAcceptsDemoConfig(t *testing.T) {
	envoyBin, err := testbed.FindEnvoy()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(envoyBin, "--mode", "validate", "-c", "../envoy/demo.yaml").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("envoy --mode validate: %v\n%s", err, out)
	}
}

// capsnap serves grpc.health.v1 beside the Authorization service, for
// Envoy's and Kubernetes' health checks.
func TestGRPCHealth(t *testing.T) {
	s := startStack(t)
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// SERVING follows readiness (which startStack waited for) by at most
	// one poll of it.
	for _, svc := range []string{"", "envoy.service.auth.v3.Authorization", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		for {
			resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("health of %q: %v, %v", svc, resp.GetStatus(), err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
