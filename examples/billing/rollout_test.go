package billing

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/pincheck"
)

// pinTransport sends a fixed capsnap pin, as Envoy does after an allow.
type pinTransport struct{ digest string }

func (p pinTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(pincheck.HeaderSchemaDigest, p.digest)
	return http.DefaultTransport.RoundTrip(r)
}

// A deploy caught half way: the handlers are new, the listing is not. The
// listing (what capsnap verifies) still shows the old contract, so only the
// handler-start check can refuse the call.
func TestRollOutHandlersIsCaughtAtHandlerStart(t *testing.T) {
	b := New(Options{Pin: true})
	srv := httptest.NewServer(b.Handler())
	t.Cleanup(srv.Close)
	var baseline string
	for _, d := range Definitions(Baseline) {
		if d.Name == ToolRefund {
			baseline, _ = pincheck.Digest(d)
		}
	}
	ctx := context.Background()
	c := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: &http.Client{Transport: pinTransport{baseline}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	args := map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: ToolRefund, Arguments: args}); err != nil {
		t.Fatalf("call pinned to the served contract: %v", err)
	}

	if err := b.RollOutHandlers(SkipFraudCheck); err != nil {
		t.Fatal(err)
	}
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range list.Tools {
		if d, _ := pincheck.Digest(tool); tool.Name == ToolRefund && d != baseline {
			t.Fatalf("the listing changed with a handler-only rollout: %s", d)
		}
	}
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: ToolRefund, Arguments: args})
	var werr *jsonrpc.Error
	if !errors.As(err, &werr) || werr.Code != pincheck.CodeRefused {
		t.Fatalf("call after the rollout: %v, want a pincheck refusal", err)
	}
	var data struct{ Reason string }
	_ = json.Unmarshal(werr.Data, &data)
	if data.Reason != pincheck.Reason {
		t.Fatalf("reason %q, want %q", data.Reason, pincheck.Reason)
	}
	if got := b.HandlerStarts(ToolRefund); got != 1 {
		t.Fatalf("refund started %d times, want 1 (the refused call must not start)", got)
	}
	if b.Variant() != Baseline {
		t.Fatalf("variant %q: a handler-only rollout must not change what is listed", b.Variant())
	}
}
