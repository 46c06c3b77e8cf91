package billing_test

// These tests use the exported API only, and complement the package's own
// tests: what a refused call looks like to an SDK client on the wire, the
// redeploy that lands between capsnap's allow and the handler's start, and
// the control API's refusals.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/examples/billing"
	"github.com/capsnap/capsnap/pincheck"
)

const bound = 10 * time.Second

// pinTransport sets x-capsnap-schema-digest on every request, as Envoy does
// on a call capsnap allowed; an empty pin sends none.
type pinTransport struct {
	base http.RoundTripper
	mu   sync.Mutex
	pin  string
}

func (p *pinTransport) set(pin string) {
	p.mu.Lock()
	p.pin = pin
	p.mu.Unlock()
}

func (p *pinTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	p.mu.Lock()
	pin := p.pin
	p.mu.Unlock()
	if pin != "" {
		r = r.Clone(r.Context())
		r.Header.Set(pincheck.HeaderSchemaDigest, pin)
	}
	return p.base.RoundTrip(r)
}

func refundDigest(t *testing.T, variant string) string {
	t.Helper()
	for _, def := range billing.Definitions(variant) {
		if def.Name == billing.ToolRefund {
			d, err := pincheck.Digest(def)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
	}
	t.Fatalf("%s has no refund", variant)
	return ""
}

func session(t *testing.T, url, version string, rt http.RoundTripper) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{Transport: rt}},
		&mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func refund(cs *mcp.ClientSession) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: billing.ToolRefund,
		Arguments: map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"}})
}

// refused checks that err is the handler_drift refusal an SDK client
// surfaces, pinned to pinned while the handler serves own.
func refused(t *testing.T, what string, err error, pinned, own string) {
	t.Helper()
	var werr *jsonrpc.Error
	if !errors.As(err, &werr) {
		t.Fatalf("%s: error %T %v, want a JSON-RPC error", what, err, err)
	}
	var data map[string]string
	if err := json.Unmarshal(werr.Data, &data); err != nil {
		t.Fatalf("%s: data %s: %v", what, werr.Data, err)
	}
	if werr.Code != -31000 || data["reason"] != "handler_drift" || data["tool"] != billing.ToolRefund ||
		data["pinned_digest"] != pinned || data["handler_digest"] != own {
		t.Errorf("%s: code %d, data %v; want -31000, handler_drift for refund, pinned %q, handler %q",
			what, werr.Code, data, pinned, own)
	}
}

func TestPinRefusalOnTheWire(t *testing.T) {
	base, skip := refundDigest(t, billing.Baseline), refundDigest(t, billing.SkipFraudCheck)
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		t.Run(version, func(t *testing.T) {
			b := billing.New(billing.Options{Pin: true})
			ts := httptest.NewServer(b.Handler())
			t.Cleanup(ts.Close)
			tr := &http.Transport{}
			t.Cleanup(tr.CloseIdleConnections)

			// Straight to the server, around capsnap: no pin.
			_, err := refund(session(t, ts.URL, version, tr))
			refused(t, "unpinned call", err, "", base)
			if n := b.HandlerStarts(billing.ToolRefund); n != 0 {
				t.Fatalf("an unpinned call started the handler %d times", n)
			}

			pin := &pinTransport{base: tr}
			pin.set(base)
			cs := session(t, ts.URL, version, pin)
			if res, err := refund(cs); err != nil || res.IsError {
				t.Fatalf("call pinned to baseline: %v, %+v", err, res)
			}
			if n := b.HandlerStarts(billing.ToolRefund); n != 1 {
				t.Fatalf("HandlerStarts = %d after one allowed call, want 1", n)
			}

			// capsnap allowed the next call against baseline; the server
			// redeploys before the handler starts.
			resp, err := ts.Client().Post(ts.URL+"/admin/variant", "text/plain", strings.NewReader(billing.SkipFraudCheck))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("POST /admin/variant: %s", resp.Status)
			}
			_, err = refund(cs)
			refused(t, "call pinned to the old contract", err, base, skip)
			if n := b.HandlerStarts(billing.ToolRefund); n != 1 {
				t.Errorf("the stale pin started the handler: %d starts, want 1", n)
			}

			// Re-authorized against what now runs, the same session works.
			pin.set(skip)
			if res, err := refund(cs); err != nil || res.IsError {
				t.Fatalf("call pinned to the new contract: %v, %+v", err, res)
			}
			if n := b.HandlerStarts(billing.ToolRefund); n != 2 {
				t.Errorf("HandlerStarts = %d, want 2", n)
			}
		})
	}
}

func TestAdminVariantRefusals(t *testing.T) {
	b := billing.New(billing.Options{})
	ts := httptest.NewServer(b.Handler())
	t.Cleanup(ts.Close)
	if err := b.SetVariant(billing.DescriptionEdit); err != nil {
		t.Fatal(err)
	}
	// The over-long body costs net/http's 500ms lingering close of a
	// connection whose request body was not read to the end.
	for _, body := range []string{"", "  ", "yolo", "SKIP_FRAUD_CHECK", strings.Repeat("b", 65), billing.Baseline + " " + billing.SchemaSwap} {
		resp, err := ts.Client().Post(ts.URL+"/admin/variant", "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST /admin/variant %q = %s, want 400", body, resp.Status)
		}
		if v := b.Variant(); v != billing.DescriptionEdit {
			t.Fatalf("POST /admin/variant %q redeployed %s", body, v)
		}
	}
	resp, err := ts.Client().Get(ts.URL + "/admin/variant")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /admin/variant = %s, want 405", resp.Status)
	}
}
