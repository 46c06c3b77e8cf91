package mcpparse

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// envoyHeaders renders h the way Envoy's ext_authz delivers headers:
// lower-case names, repeated values joined by ",".
func envoyHeaders(h http.Header) map[string]string {
	out := make(map[string]string, len(h))
	for k, vs := range h {
		out[strings.ToLower(k)] = strings.Join(vs, ",")
	}
	return out
}

// capturedHeaders are the headers a golden file keeps: the ones Parse reads
// (host, user-agent and the like vary from run to run and are not read).
var capturedHeaders = []string{"content-type", "content-length", "content-encoding", "mcp-protocol-version", "mcp-session-id", "mcp-method", "mcp-name"}

type refundInput struct {
	OrderID    string  `json:"order_id"`
	Amount     float64 `json:"amount"`
	ReasonCode string  `json:"reason_code"`
}

// TestSDKClientTraffic puts Parse between the official Go SDK's client and
// server, as Envoy puts capsnap, for each protocol version: every POST the
// client makes must be accepted and read as what it is. With -update it
// records that traffic as testdata/requests/sdk-<version>.json.
func TestSDKClientTraffic(t *testing.T) {
	for _, v := range []Version{V20250326, V20250618, V20251125, V20260728} {
		t.Run(string(v), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			stateless := v == V20260728
			server := mcp.NewServer(&mcp.Implementation{Name: "billing", Version: "1.0.0"}, &mcp.ServerOptions{
				GetSessionID: func() string { return "capsnap-test-session" },
			})
			mcp.AddTool(server, &mcp.Tool{Name: "refund", Description: "Refund an order in USD."},
				func(ctx context.Context, req *mcp.CallToolRequest, in refundInput) (*mcp.CallToolResult, any, error) {
					// A server-to-client request, so that the client answers
					// with a JSON-RPC response in a POST of its own.
					if !stateless {
						//lint:ignore SA1019 any server-to-client request will do; roots is the SDK's simplest
						if _, err := req.Session.ListRoots(ctx, nil); err != nil {
							return nil, nil, err
						}
					}
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "refunded"}}}, nil, nil
				})
			handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
				&mcp.StreamableHTTPOptions{Stateless: stateless})

			var (
				mu    sync.Mutex
				cases []requestCase
			)
			gate := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPost {
					body, err := io.ReadAll(r.Body)
					if err != nil {
						t.Error(err)
					}
					headers := envoyHeaders(r.Header)
					parsedReq, err := Parse(body, headers, Limits{})
					if err != nil {
						t.Errorf("Parse refused what the SDK client sent:\n%s\n%v", body, err)
						http.Error(w, err.Error(), http.StatusForbidden)
						return
					}
					kept := map[string]string{}
					for _, k := range capturedHeaders {
						if hv, ok := headers[k]; ok {
							kept[k] = hv
						}
					}
					quoted, _ := json.Marshal(string(body))
					mu.Lock()
					m := parsedReq.Messages[0]
					cases = append(cases, requestCase{
						Name:    strings.TrimSpace(fmt.Sprintf("%02d %s %s", len(cases), m.Kind, m.Method)),
						Headers: kept,
						Body:    quoted,
						Want:    summarize(parsedReq),
					})
					mu.Unlock()
					r.Body = io.NopCloser(bytes.NewReader(body))
				}
				handler.ServeHTTP(w, r)
			})
			ts := httptest.NewServer(gate)
			defer ts.Close()

			client := mcp.NewClient(&mcp.Implementation{Name: "support-agent", Version: "1.0.0"}, nil)
			cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: ts.URL, DisableStandaloneSSE: true},
				&mcp.ClientSessionOptions{ProtocolVersion: string(v)})
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			if _, err := cs.ListTools(ctx, nil); err != nil {
				t.Fatalf("tools/list: %v", err)
			}
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{
				Name:      "refund",
				Arguments: map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"},
			})
			if err != nil || res.IsError {
				t.Fatalf("tools/call: %v %+v", err, res)
			}
			// The v1.8.0 client sends a 2026-07-28 ping without the _meta
			// its own server requires, so the server (not Parse) refuses it.
			if !stateless {
				if err := cs.Ping(ctx, nil); err != nil {
					t.Fatalf("ping: %v", err)
				}
			}
			if err := cs.Close(); err != nil {
				t.Logf("close: %v", err)
			}

			mu.Lock()
			defer mu.Unlock()
			var calls, responses int
			for _, c := range cases {
				if c.Want.Version != v && c.Want.Messages[0].Method != "initialize" {
					t.Errorf("%s: read as version %s, want %s", c.Name, c.Want.Version, v)
				}
				for _, m := range c.Want.Messages {
					if m.Method == "tools/call" && m.Tool == "refund" {
						calls++
					}
					if m.Kind == KindResponse.String() {
						responses++
					}
				}
			}
			if calls != 1 {
				t.Errorf("saw %d tools/call of refund, want 1", calls)
			}
			if !stateless && responses == 0 {
				t.Errorf("saw no client response to the server's roots/list")
			}
			if *update {
				writeGolden(t, "testdata/requests/sdk-"+string(v)+".json", cases)
			}
		})
	}
}
