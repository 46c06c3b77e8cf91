package extauthz

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/policy"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the current responses")

// staticCatalog is a Catalog that knows one server's tools, read from a
// tools/list result, and nothing of any other server.
type staticCatalog map[string]*catalog.List

var _ Catalog = staticCatalog(nil)

func (c staticCatalog) Lookup(id string) (*catalog.List, catalog.Status, error) {
	l, ok := c[id]
	if !ok {
		return nil, catalog.Status{}, deny.Errorf(deny.CatalogUnavailable, "server %q has never been listed", id)
	}
	return l, catalog.Status{Synced: true, FetchedAt: l.FetchedAt}, nil
}

func loadCatalog(t testing.TB, path string) staticCatalog {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var result struct {
		Tools []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(data, &result); err != nil {
		t.Fatal(err)
	}
	l := &catalog.List{ServerID: "billing", Tools: map[string]catalog.Tool{}, FetchedAt: time.Unix(1_800_000_000, 0)}
	for _, def := range result.Tools {
		d, canon, err := mcpparse.ToolDigest(def)
		if err != nil {
			t.Fatal(err)
		}
		var name struct{ Name string }
		_ = json.Unmarshal(def, &name)
		l.Tools[name.Name] = catalog.Tool{Name: name.Name, Digest: d, Definition: canon}
	}
	return staticCatalog{"billing": l}
}

func newTestServer(t testing.TB, reg prometheus.Registerer, audit *bytes.Buffer) *Server {
	t.Helper()
	pol, err := policy.Load("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	principal := config.Default().Principal
	principal.Source = config.SourceMTLS
	s, err := New(Options{
		Catalog:   loadCatalog(t, "testdata/catalog.json"),
		Servers:   []string{"billing", "files"},
		Policy:    pol,
		Principal: principal,
		Limits:    mcpparse.DefaultLimits,
		Audit:     zerolog.New(audit),
		Metrics:   NewMetrics(reg),
		Now:       func() time.Time { return time.Unix(1_800_000_100, 0) },
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type checkCase struct {
	Name      string            `json:"name"`
	Method    string            `json:"method"`
	Principal string            `json:"principal"`
	ServerID  string            `json:"server_id"`
	Headers   map[string]string `json:"headers"`
	Body      string            `json:"body"`
	AsString  bool              `json:"as_string"`
}

// request builds the CheckRequest Envoy would send for c, with the
// settings of envoy/demo.yaml (pack_as_bytes unless as_string).
func (c checkCase) request() *authv3.CheckRequest {
	h := &authv3.AttributeContext_HttpRequest{
		Id: "req-" + c.Name, Method: c.Method, Path: "/mcp", Host: "billing",
		Headers: map[string]string{
			":method": c.Method, ":path": "/mcp", "content-type": "application/json",
			"accept": "application/json, text/event-stream", "x-request-id": "rid-" + c.Name,
		},
	}
	if h.Method == "" {
		h.Method = "POST"
	}
	for k, v := range c.Headers {
		h.Headers[k] = v
	}
	if c.AsString {
		h.Body = c.Body
	} else {
		h.RawBody = []byte(c.Body)
	}
	ext := map[string]string{ServerIDKey: "billing"}
	switch c.ServerID {
	case "":
	case "-":
		ext = nil
	default:
		ext[ServerIDKey] = c.ServerID
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source:            &authv3.AttributeContext_Peer{Principal: c.Principal},
		Request:           &authv3.AttributeContext_Request{Http: h},
		ContextExtensions: ext,
	}}
}

// TestCheckGolden runs every request in testdata/checks.json and compares
// Envoy's view of the answer with testdata/golden/<name>.json.
func TestCheckGolden(t *testing.T) {
	data, err := os.ReadFile("testdata/checks.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []checkCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	var audit bytes.Buffer
	s := newTestServer(t, prometheus.NewRegistry(), &audit)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			resp, err := s.Check(t.Context(), c.request())
			if err != nil {
				t.Fatalf("Check returned a gRPC error: %v", err)
			}
			got := stableJSON(t, resp)
			path := filepath.Join("testdata/golden", c.Name+".json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("response differs from %s:\ngot:\n%s\nwant:\n%s", path, got, want)
			}
		})
	}
}

// stableJSON renders a response as indented JSON with sorted header lists;
// protojson alone varies its whitespace on purpose.
func stableJSON(t *testing.T, resp *authv3.CheckResponse) []byte {
	t.Helper()
	if ok := resp.GetOkResponse(); ok != nil {
		sort.Strings(ok.HeadersToRemove)
	}
	raw, err := protojson.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(out, '\n')
}

// A denial's body must be a JSON-RPC error for the request's own id, with
// capsnap's code and the reason in data, or an MCP client cannot act on it.
func TestDeniedBodyIsJSONRPCError(t *testing.T) {
	s := newTestServer(t, prometheus.NewRegistry(), new(bytes.Buffer))
	for _, tc := range []struct {
		body   string
		id     string
		reason deny.Reason
	}{
		{`{"jsonrpc":"2.0","id":"abc","method":"tools/call","params":{"name":"nope","arguments":{}}}`, `"abc"`, deny.UnknownTool},
		{`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"export_ledger"}}`, `42`, deny.UnclassifiedTool},
		{`not json`, `null`, deny.MalformedRequest},
	} {
		resp, _ := s.Check(t.Context(), checkCase{Principal: "spiffe://acme/agent/support-refund", Body: tc.body}.request())
		denied := resp.GetDeniedResponse()
		if denied == nil {
			t.Fatalf("%s: allowed", tc.body)
		}
		var msg struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Error   struct {
				Code int `json:"code"`
				Data struct {
					Reason deny.Reason `json:"reason"`
				} `json:"data"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(denied.Body), &msg); err != nil {
			t.Fatalf("%s: body %q: %v", tc.body, denied.Body, err)
		}
		if msg.JSONRPC != "2.0" || string(msg.ID) != tc.id || msg.Error.Code != CodeDenied || msg.Error.Data.Reason != tc.reason {
			t.Errorf("%s: got %s", tc.body, denied.Body)
		}
		var reasonHeader string
		for _, h := range denied.Headers {
			if h.GetHeader().GetKey() == HeaderReason {
				reasonHeader = h.GetHeader().GetValue()
			}
		}
		if reasonHeader != string(tc.reason) {
			t.Errorf("%s: %s = %q, want %q", tc.body, HeaderReason, reasonHeader, tc.reason)
		}
	}
}

func TestPrincipalSources(t *testing.T) {
	const who = "spiffe://acme/agent/support-refund"
	jwt := func(claims map[string]any) *corev3.Metadata {
		payload, err := structpb.NewStruct(map[string]any{"jwt_payload": claims})
		if err != nil {
			t.Fatal(err)
		}
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": payload}}
	}
	tests := []struct {
		name   string
		source string
		peer   string
		meta   *corev3.Metadata
		header string
		want   deny.Reason // "" for allow
	}{
		{"mtls peer", config.SourceMTLS, who, nil, "", ""},
		{"mtls ignores header", config.SourceMTLS, "", nil, who, deny.NoPrincipal},
		{"mtls control character", config.SourceMTLS, who + "\n", nil, "", deny.NoPrincipal},
		{"jwt claim", config.SourceJWT, "", jwt(map[string]any{"sub": who}), "", ""},
		{"jwt ignores peer", config.SourceJWT, who, nil, "", deny.NoPrincipal},
		{"jwt claim not a string", config.SourceJWT, "", jwt(map[string]any{"sub": 7}), "", deny.NoPrincipal},
		{"jwt other claim", config.SourceJWT, "", jwt(map[string]any{"email": who}), "", deny.NoPrincipal},
		{"header", config.SourceHeader, "", nil, who, ""},
		{"header ignores peer", config.SourceHeader, who, nil, "", deny.NoPrincipal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestServer(t, prometheus.NewRegistry(), new(bytes.Buffer))
			s.principal.Source = tt.source
			c := checkCase{Principal: tt.peer, Body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"lookup_order","arguments":{}}}`}
			if tt.header != "" {
				c.Headers = map[string]string{s.principal.Header: tt.header}
			}
			req := c.request()
			req.Attributes.MetadataContext = tt.meta
			resp, err := s.Check(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			got := deny.Reason("")
			if d := resp.GetDeniedResponse(); d != nil {
				for _, h := range d.Headers {
					if h.GetHeader().GetKey() == HeaderReason {
						got = deny.Reason(h.GetHeader().GetValue())
					}
				}
			}
			if got != tt.want {
				t.Errorf("reason %q, want %q", got, tt.want)
			}
		})
	}
}

// Every decision is counted under a bounded label set and audited once.
func TestMetricsAndAudit(t *testing.T) {
	reg := prometheus.NewRegistry()
	var audit bytes.Buffer
	s := newTestServer(t, reg, &audit)
	allow := checkCase{Principal: "spiffe://acme/agent/support-refund", Body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund","arguments":{}}}`}
	deny1 := checkCase{Principal: "spiffe://acme/agent/support-refund", ServerID: "not-configured", Body: `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`}
	for _, c := range []checkCase{allow, allow, deny1} {
		if _, err := s.Check(t.Context(), c.request()); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(s.metrics.decisions.WithLabelValues("allow", "ok", "billing", "money_move")); got != 2 {
		t.Errorf("allow count = %v, want 2", got)
	}
	// An unconfigured server_id from a route must not mint a new label value.
	if got := testutil.ToFloat64(s.metrics.decisions.WithLabelValues("deny", "unknown_server", "unknown", "none")); got != 1 {
		t.Errorf("deny count = %v, want 1", got)
	}
	lines := bytes.Split(bytes.TrimSpace(audit.Bytes()), []byte("\n"))
	if len(lines) != 3 {
		t.Fatalf("%d audit lines, want 3", len(lines))
	}
	var first map[string]any
	if err := json.Unmarshal(lines[0], &first); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"decision": "allow", "reason": "ok", "tool": "refund", "server_id": "billing", "effect_class": "money_move", "request_id": "rid-", "jsonrpc_id": 1.0} {
		if first[k] != want {
			t.Errorf("audit %s = %v, want %v", k, first[k], want)
		}
	}
}
