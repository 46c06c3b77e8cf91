package billing

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/pincheck"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// wait bounds every wait on the server.
const wait = 10 * time.Second

// versions are the MCP versions the server must serve: two with sessions
// and the GET stream, and 2026-07-28 with subscriptions/listen.
var versions = []string{"2025-06-18", "2025-11-25", "2026-07-28"}

func digestOf(t *testing.T, tool *mcp.Tool) string {
	t.Helper()
	raw, err := json.Marshal(tool)
	if err != nil {
		t.Fatal(err)
	}
	d, _, err := mcpparse.ToolDigest(raw)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func byName(tools []*mcp.Tool, name string) *mcp.Tool {
	for _, t := range tools {
		if t.Name == name {
			return t
		}
	}
	return nil
}

func TestVariantDigests(t *testing.T) {
	base := Definitions(Baseline)
	baseRefund, baseLookup := digestOf(t, byName(base, ToolRefund)), digestOf(t, byName(base, ToolLookupOrder))
	seen := map[string]string{baseRefund: Baseline}
	tests := []struct {
		variant string
		// check is the change the variant must make to refund.
		check func(*mcp.Tool) bool
	}{
		{DescriptionEdit, func(r *mcp.Tool) bool {
			return strings.Contains(r.Description, "VIP") && !hasProperty(r, "skip_fraud_check")
		}},
		{SkipFraudCheck, func(r *mcp.Tool) bool {
			return strings.Contains(r.Description, "skip_fraud_check") && hasProperty(r, "skip_fraud_check")
		}},
		{SchemaSwap, func(r *mcp.Tool) bool {
			return r.Description == reviewedRefund && hasProperty(r, "destination_account")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.variant, func(t *testing.T) {
			defs := Definitions(tt.variant)
			refund := byName(defs, ToolRefund)
			if refund == nil || !tt.check(refund) {
				t.Fatalf("refund is not the %s variant: %+v", tt.variant, refund)
			}
			d := digestOf(t, refund)
			if other, dup := seen[d]; dup {
				t.Errorf("refund's digest %s is the same as in %s", d, other)
			}
			seen[d] = tt.variant
			if got := digestOf(t, byName(defs, ToolLookupOrder)); got != baseLookup {
				t.Errorf("lookup_order's digest changed: %s, baseline %s", got, baseLookup)
			}
		})
	}
	if Definitions("friday_hotfix") != nil {
		t.Error("Definitions of an unknown variant is not nil")
	}
}

func hasProperty(tool *mcp.Tool, name string) bool {
	props, _ := tool.InputSchema.(map[string]any)["properties"].(map[string]any)
	_, ok := props[name]
	return ok
}

// serve runs b's handler on loopback until the test ends.
func serve(t *testing.T, b *Billing) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(b.Handler())
	t.Cleanup(s.Close)
	return s
}

// connect opens a session of client (nil: a plain one) that sends header
// on every request.
func connect(t *testing.T, s *httptest.Server, version string, client *mcp.Client, header http.Header) *mcp.ClientSession {
	t.Helper()
	tr := &http.Transport{}
	hc := &http.Client{Transport: headerAdder{tr, header}}
	if client == nil {
		client = mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.URL + "/mcp", HTTPClient: hc},
		&mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() {
		_ = cs.Close()
		tr.CloseIdleConnections()
	})
	if got := cs.InitializeResult().ProtocolVersion; got != version {
		t.Fatalf("negotiated %s, want %s", got, version)
	}
	if (cs.ID() == "") != (version >= "2026-07-28") {
		t.Fatalf("session id %q on %s", cs.ID(), version)
	}
	return cs
}

type headerAdder struct {
	base   http.RoundTripper
	header http.Header
}

func (h headerAdder) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.header {
		r.Header[k] = v
	}
	return h.base.RoundTrip(r)
}

func listed(t *testing.T, cs *mcp.ClientSession) []*mcp.Tool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	return res.Tools
}

// TestSetVariantNotifies redeploys the server under a connected client: the
// client hears list_changed, and what it then lists digests to exactly the
// variant's definitions, the digests the pins are checked against.
func TestSetVariantNotifies(t *testing.T) {
	for _, version := range versions {
		t.Run(version, func(t *testing.T) {
			b := New(Options{})
			s := serve(t, b)
			notified := make(chan struct{}, 1)
			client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, &mcp.ClientOptions{
				ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
					select {
					case notified <- struct{}{}:
					default:
					}
				},
			})
			// On 2026-07-28 the SDK opens subscriptions/listen without
			// waiting for it; a redeploy must not beat the server's
			// acknowledgement.
			acked := make(chan struct{}, 1)
			client.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
				return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
					if method == "notifications/subscriptions/acknowledged" {
						acked <- struct{}{}
					}
					return next(ctx, method, req)
				}
			})
			cs := connect(t, s, version, client, nil)
			if version >= "2026-07-28" {
				select {
				case <-acked:
				case <-time.After(wait):
					t.Fatalf("subscriptions/listen not acknowledged within %v", wait)
				}
			}
			for _, variant := range append(Variants()[1:], Baseline) {
				postVariant(t, s, variant, http.StatusOK)
				select {
				case <-notified:
				case <-time.After(wait):
					t.Fatalf("no list_changed within %v of redeploying %s", wait, variant)
				}
				got := listed(t, cs)
				for _, want := range Definitions(variant) {
					tool := byName(got, want.Name)
					if tool == nil || digestOf(t, tool) != digestOf(t, want) {
						t.Errorf("%s: %s as listed does not digest as its definition", variant, want.Name)
					}
				}
				if st := stats(t, s); st.Variant != variant || b.Variant() != variant {
					t.Errorf("stats say variant %s, Variant() %s; want %s", st.Variant, b.Variant(), variant)
				}
			}
		})
	}
}

func TestCalls(t *testing.T) {
	tests := []struct {
		name    string
		variant string
		tool    string
		args    map[string]any
		wantErr bool
		want    string // in the result text
	}{
		{"refund", Baseline, ToolRefund, map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"}, false, "rf_0001"},
		{"refund with an unreviewed field", Baseline, ToolRefund,
			map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge", "skip_fraud_check": true}, true, "skip_fraud_check"},
		{"refund without an amount", Baseline, ToolRefund, map[string]any{"order_id": "A-100", "reason_code": "damaged"}, true, "amount"},
		{"the attack validates once deployed", SkipFraudCheck, ToolRefund,
			map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge", "skip_fraud_check": true}, false, "rf_0001"},
		{"swapped schema", SchemaSwap, ToolRefund, map[string]any{"order_id": "A-100", "amount": "4000", "destination_account": "X-9"}, false, "rf_0001"},
		{"lookup", Baseline, ToolLookupOrder, map[string]any{"order_id": "A-100"}, false, "delivered"},
		{"refund of an order that does not exist", Baseline, ToolRefund, map[string]any{"order_id": "X-404", "amount": 40, "reason_code": "damaged"}, true, "order X-404 not found"},
		{"lookup of an order that does not exist", Baseline, ToolLookupOrder, map[string]any{"order_id": "X-1"}, true, "order X-1 not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(Options{})
			if err := b.SetVariant(tt.variant); err != nil {
				t.Fatal(err)
			}
			cs := connect(t, serve(t, b), "2025-11-25", nil, nil)
			res := call(t, cs, tt.tool, tt.args)
			if res.IsError != tt.wantErr || !strings.Contains(text(res), tt.want) {
				t.Errorf("result %q (error %v), want one with %q (error %v)", text(res), res.IsError, tt.want, tt.wantErr)
			}
			// A call the handler refused still started it.
			if got := b.HandlerStarts(tt.tool); got != 1 {
				t.Errorf("HandlerStarts(%s) = %d, want 1", tt.tool, got)
			}
		})
	}
}

func TestStatsAndReset(t *testing.T) {
	b := New(Options{})
	s := serve(t, b)
	cs := connect(t, s, "2026-07-28", nil, nil)
	refund := map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"}
	call(t, cs, ToolRefund, refund)
	call(t, cs, ToolRefund, refund)
	call(t, cs, ToolLookupOrder, map[string]any{"order_id": "A-100"})
	postVariant(t, s, SchemaSwap, http.StatusOK)

	want := Stats{Variant: SchemaSwap, HandlerStarts: map[string]int{ToolRefund: 2, ToolLookupOrder: 1}}
	if got := stats(t, s); got.Variant != want.Variant || !maps.Equal(got.HandlerStarts, want.HandlerStarts) {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	postVariant(t, s, "friday_hotfix", http.StatusBadRequest)
	if b.Variant() != SchemaSwap {
		t.Errorf("an unknown variant changed the variant to %s", b.Variant())
	}

	resp, err := http.Post(s.URL+"/admin/reset", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want = Stats{Variant: Baseline, HandlerStarts: map[string]int{ToolRefund: 0, ToolLookupOrder: 0}}
	if got := stats(t, s); got.Variant != want.Variant || !maps.Equal(got.HandlerStarts, want.HandlerStarts) {
		t.Errorf("after reset: stats %+v, want %+v", got, want)
	}
}

// TestPin checks that a pinned server refuses, before its handler starts, a
// call whose pin is missing or is another definition's digest.
func TestPin(t *testing.T) {
	refund := map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"}
	own, err := pincheck.Digest(byName(Definitions(Baseline), ToolRefund))
	if err != nil {
		t.Fatal(err)
	}
	stale, err := pincheck.Digest(byName(Definitions(SkipFraudCheck), ToolRefund))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		pin       string
		wantStart bool
	}{
		{"no pin", "", false},
		{"another definition's digest", stale, false},
		{"its own digest", own, true},
	}
	for _, version := range versions {
		for _, tt := range tests {
			t.Run(version+"/"+tt.name, func(t *testing.T) {
				b := New(Options{Pin: true})
				header := http.Header{}
				if tt.pin != "" {
					header.Set(pincheck.HeaderSchemaDigest, tt.pin)
				}
				cs := connect(t, serve(t, b), version, nil, header)
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				defer cancel()
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: ToolRefund, Arguments: refund})
				if (err == nil) != tt.wantStart {
					t.Errorf("call error %v, want an error: %v", err, !tt.wantStart)
				}
				if got := b.HandlerStarts(ToolRefund); (got == 1) != tt.wantStart {
					t.Errorf("HandlerStarts = %d, want a start: %v", got, tt.wantStart)
				}
			})
		}
	}
}

func call(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func postVariant(t *testing.T, s *httptest.Server, variant string, want int) {
	t.Helper()
	resp, err := http.Post(s.URL+"/admin/variant", "text/plain", strings.NewReader(variant))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /admin/variant %s: %s %s, want %d", variant, resp.Status, body, want)
	}
}

func stats(t *testing.T, s *httptest.Server) Stats {
	t.Helper()
	resp, err := http.Get(s.URL + "/admin/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}
