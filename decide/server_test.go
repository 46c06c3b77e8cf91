package decide

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/store"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the current responses")

// pushSource is a catalog.Source the test drives: each push publishes a
// tools/list result to the real catalog, synchronously.
type pushSource struct {
	ready   chan struct{}
	publish catalog.Publish
}

var _ catalog.Source = (*pushSource)(nil)

func (p *pushSource) Run(ctx context.Context, publish catalog.Publish) error {
	p.publish = publish
	close(p.ready)
	<-ctx.Done()
	return nil
}

// push publishes the tools of a tools/list result file, or an error.
func (p *pushSource) push(t testing.TB, path string, err error) {
	t.Helper()
	if err != nil {
		p.publish(nil, err)
		return
	}
	p.publish(readTools(t, path), nil)
}

// readTools returns the tool definitions of a tools/list result file.
func readTools(t testing.TB, path string) []json.RawMessage {
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
	return result.Tools
}

// clock is a test clock that moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// fixture is a Server over a real catalog of two servers (billing and
// payments, both serving refund) and a real snapshot store.
type fixture struct {
	*Server
	// envoy is the Envoy adapter over Server (Envoy).
	envoy    authv3.AuthorizationServer
	clock    *clock
	billing  *pushSource
	payments *pushSource
	audit    *bytes.Buffer
	reg      *prometheus.Registry
}

func newFixture(t testing.TB, opts ...func(*Options)) *fixture {
	t.Helper()
	f := &fixture{
		clock:    &clock{t: time.Unix(1_800_000_000, 0)},
		billing:  &pushSource{ready: make(chan struct{})},
		payments: &pushSource{ready: make(chan struct{})},
		audit:    new(bytes.Buffer),
		reg:      prometheus.NewRegistry(),
	}
	cat := catalog.New(map[string]catalog.Source{"billing": f.billing, "payments": f.payments}, catalog.Options{
		Clock: f.clock.now,
		OnChange: func(id string, prev, next *catalog.List, changed []string) {
			f.CatalogChanged(id, prev, next, changed)
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = cat.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-f.billing.ready
	<-f.payments.ready

	rules, err := LoadRules("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	store, err := store.NewMemory(store.MemoryOptions{MaxSnapshots: 1000, Retain: time.Hour, Now: f.clock.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	principal := config.Default().Principal
	principal.Source = config.SourceMTLS
	var n int
	o := Options{
		Catalog:     cat,
		Servers:     []string{"billing", "payments", "files"},
		Rules:       rules,
		Denials:     config.Default().Denials,
		Snapshots:   store,
		SnapshotTTL: 5 * time.Minute,
		Freshness:   config.Catalog{MaxAge: 2 * time.Minute},
		Principal:   principal,
		Limits:      mcpparse.DefaultLimits,
		Audit:       zerolog.New(f.audit),
		Metrics:     NewMetrics(f.reg),
		Now:         f.clock.now,
		NewEpoch:    func() string { n++; return fmt.Sprintf("ep_test_%d", n) },
		ListingKey:  []byte("fixture listing key"),
	}
	for _, opt := range opts {
		opt(&o)
	}
	f.Server, err = New(o)
	if err != nil {
		t.Fatal(err)
	}
	f.envoy = Envoy(f.Server)
	f.billing.push(t, "testdata/catalog.json", nil)
	f.payments.push(t, "testdata/payments.json", nil)
	return f
}

type checkCase struct {
	Name      string            `json:"name"`
	Method    string            `json:"method"`
	Principal string            `json:"principal"`
	ServerID  string            `json:"server_id"`
	Headers   map[string]string `json:"headers"`
	Body      string            `json:"body"`
	AsString  bool              `json:"as_string"`
	// ListFirst runs a tools/list as the same principal first, minting
	// the snapshot the case is verified against.
	ListFirst bool `json:"list_first"`
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

const listBody = `{"jsonrpc":"2.0","id":"l","method":"tools/list","params":{}}`

// validArgs satisfy each billing tool's inputSchema in testdata, so that a
// call is decided on its contract, not on its arguments.
var validArgs = map[string]string{
	"refund":       `{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`,
	"lookup_order": `{"order_id":"A-100"}`,
}

func callBody(tool string) string {
	args, ok := validArgs[tool]
	if !ok {
		args = "{}"
	}
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, tool, args)
}

// paymentsRefund satisfies testdata/payments.json's refund.
const paymentsRefund = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund","arguments":{"payment_id":"p-1","amount":"4000"}}}`

// list runs a tools/list as principal on server and returns the epoch the
// client is given. On the response path (the default), the server's
// response delivers exactly what the catalog holds now.
func (f *fixture) list(t testing.TB, principal, server string, headers map[string]string) string {
	t.Helper()
	resp, err := f.Check(context.Background(), checkCase{Principal: principal, ServerID: server, Headers: headers, Body: listBody}.request())
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOkResponse() == nil {
		t.Fatalf("tools/list denied: %s", resp.GetDeniedResponse().GetBody())
	}
	if ticket := listingTicket(t, resp); ticket != "" {
		out := f.Deliver(ticket, ResponseHead{Status: 200, ContentType: "application/json"}, f.served(t, server, `"l"`))
		if out.Fail != nil {
			t.Fatalf("tools/list response refused: %v", out.Fail)
		}
		return deliveredHeader(out, HeaderEpoch)
	}
	epoch := okHeader(resp, HeaderEpoch)
	if epoch == "" {
		t.Fatal("tools/list response carries no epoch")
	}
	return epoch
}

// listBefore lists billing's tools as c's principal, in c's session and
// version: a 2026-07-28 listing mirrors its own method and names nothing.
func (f *fixture) listBefore(t testing.TB, c checkCase) {
	t.Helper()
	h := map[string]string{}
	for _, k := range []string{"mcp-protocol-version", "mcp-session-id"} {
		if v, ok := c.Headers[k]; ok {
			h[k] = v
		}
	}
	if _, ok := c.Headers["mcp-method"]; ok {
		h["mcp-method"] = "tools/list"
	}
	f.list(t, c.Principal, "billing", h)
}

// listingTicket is the listing ticket in an allowed Check's metadata.
func listingTicket(t testing.TB, resp *authv3.CheckResponse) string {
	return onTheWire(t, resp).GetDynamicMetadata().GetFields()["listing"].GetStringValue()
}

// served is the tools/list response the server would send now for id: the
// catalog's current definitions.
func (f *fixture) served(t testing.TB, server, id string) []byte {
	t.Helper()
	list, _, err := f.catalog.Lookup(server)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(list.Tools))
	for n := range list.Tools {
		names = append(names, n)
	}
	sort.Strings(names)
	var defs []string
	for _, n := range names {
		defs = append(defs, string(list.Tools[n].Definition))
	}
	return []byte(`{"jsonrpc":"2.0","id":` + id + `,"result":{"tools":[` + strings.Join(defs, ",") + `]}}`)
}

// deliveredHeader is the value of header key on what Deliver delivers.
func deliveredHeader(out *Delivery, key string) string {
	for _, h := range out.Headers {
		if h[0] == key {
			return h[1]
		}
	}
	return ""
}

// okHeader is the value of the response header key an allowed Check adds.
func okHeader(resp *authv3.CheckResponse, key string) string {
	for _, h := range resp.GetOkResponse().GetResponseHeadersToAdd() {
		if h.GetHeader().GetKey() == key {
			return h.GetHeader().GetValue()
		}
	}
	return ""
}

// outcome is what a Check decided, as the caller and the upstream see it.
type outcome struct {
	reason   deny.Reason       // "" when allowed
	drift    string            // x-capability-drift
	data     errorData         // the JSON-RPC error's data, when denied
	upstream map[string]string // headers set for the upstream, when allowed
}

func (f *fixture) call(t testing.TB, c checkCase) outcome {
	t.Helper()
	resp, err := f.Check(context.Background(), c.request())
	if err != nil {
		t.Fatal(err)
	}
	var o outcome
	if ok := resp.GetOkResponse(); ok != nil {
		o.upstream = map[string]string{}
		for _, h := range ok.Headers {
			o.upstream[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
		}
		return o
	}
	d := resp.GetDeniedResponse()
	for _, h := range d.Headers {
		switch h.GetHeader().GetKey() {
		case HeaderReason:
			o.reason = deny.Reason(h.GetHeader().GetValue())
		case HeaderDrift:
			o.drift = h.GetHeader().GetValue()
		}
	}
	var body struct {
		Error struct {
			Data errorData `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(d.Body), &body); err != nil {
		t.Fatalf("denial body %q: %v", d.Body, err)
	}
	o.data = body.Error.Data
	return o
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
	f := newFixture(t)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			if c.ListFirst {
				f.list(t, c.Principal, "billing", nil)
			}
			resp, err := f.Check(t.Context(), c.request())
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

// stableJSON renders a response as Envoy reads it, decoded from the wire
// (where the pre-encoded metadata becomes a Struct again), as indented
// JSON with sorted header lists; protojson alone varies its whitespace on
// purpose.
func stableJSON(t *testing.T, resp *authv3.CheckResponse) []byte {
	t.Helper()
	resp = onTheWire(t, resp)
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

// onTheWire is resp encoded and decoded again, as its receiver sees it.
func onTheWire(t testing.TB, resp *authv3.CheckResponse) *authv3.CheckResponse {
	t.Helper()
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	out := new(authv3.CheckResponse)
	if err := proto.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	if len(out.ProtoReflect().GetUnknown()) != 0 {
		t.Fatalf("the response has bytes no CheckResponse field decodes: %x", out.ProtoReflect().GetUnknown())
	}
	return out
}

const (
	support = "spiffe://acme/agent/support-refund"
	auditor = "spiffe://acme/agent/auditor"
)

// TestDrift is the seed's negative tests at capsnap's gRPC interface: each
// row mints a snapshot, changes one thing, and calls.
func TestDrift(t *testing.T) {
	tests := []struct {
		name   string
		change func(t *testing.T, f *fixture)
		call   checkCase
		want   deny.Reason
		drift  bool
	}{
		{"unchanged", nil, checkCase{Principal: support, Body: callBody("refund")}, "", false},
		{"description-only edit", func(t *testing.T, f *fixture) { f.billing.push(t, "testdata/catalog-description.json", nil) },
			checkCase{Principal: support, Body: callBody("refund")}, deny.SchemaDrift, true},
		{"optional consequential field", func(t *testing.T, f *fixture) { f.billing.push(t, "testdata/catalog-skip-fraud.json", nil) },
			checkCase{Principal: support, Body: callBody("refund")}, deny.SchemaDrift, true},
		{"tool removed", func(t *testing.T, f *fixture) { f.billing.push(t, "testdata/catalog-no-refund.json", nil) },
			checkCase{Principal: support, Body: callBody("refund")}, deny.SchemaDrift, true},
		{"changed and changed back", func(t *testing.T, f *fixture) {
			f.billing.push(t, "testdata/catalog-description.json", nil)
			f.billing.push(t, "testdata/catalog.json", nil)
		}, checkCase{Principal: support, Body: callBody("refund")}, deny.SchemaDrift, true},
		{"other tool changed", func(t *testing.T, f *fixture) { f.billing.push(t, "testdata/catalog-lookup-edit.json", nil) },
			checkCase{Principal: support, Body: callBody("refund")}, "", false},
		{"new tool never joins a snapshot", func(t *testing.T, f *fixture) {
			f.billing.push(t, "testdata/catalog-new-tool.json", nil)
			f.SetRules(mustRules(t, "testdata/policy-new-tool.yaml"))
		}, checkCase{Principal: support, Body: callBody("issue_credit")}, deny.NoSnapshot, false},
		{"replayed by another principal", nil,
			checkCase{Principal: auditor, Headers: map[string]string{HeaderEpoch: "ep_test_1"}, Body: callBody("refund")}, deny.PrincipalMismatch, true},
		{"effect class raised", func(t *testing.T, f *fixture) { f.SetRules(mustRules(t, "testdata/policy-refund-admin.yaml")) },
			checkCase{Principal: support, Body: callBody("refund")}, deny.EffectEscalation, true},
		{"rules for the tool changed", func(t *testing.T, f *fixture) { f.SetRules(mustRules(t, "testdata/policy-refund-wildcard.yaml")) },
			checkCase{Principal: support, Body: callBody("refund")}, deny.PolicyDrift, true},
		{"grant withdrawn", func(t *testing.T, f *fixture) { f.SetRules(mustRules(t, "testdata/policy-no-refund.yaml")) },
			checkCase{Principal: support, Body: callBody("refund")}, deny.PolicyDrift, true},
		{"rules for another tool changed", func(t *testing.T, f *fixture) { f.SetRules(mustRules(t, "testdata/policy-lookup-write.yaml")) },
			checkCase{Principal: support, Body: callBody("refund")}, "", false},
		{"expired", func(t *testing.T, f *fixture) { f.clock.advance(5*time.Minute + time.Second) },
			checkCase{Principal: support, Body: callBody("refund")}, deny.SnapshotExpired, true},
		{"client planned against another digest", nil,
			checkCase{Principal: support, Headers: map[string]string{HeaderSchemaDigest: "sha256:0000"}, Body: callBody("refund")}, deny.SchemaDrift, true},
		{"client names an unknown epoch", nil,
			checkCase{Principal: support, Headers: map[string]string{HeaderEpoch: "ep_forged"}, Body: callBody("refund")}, deny.NoSnapshot, false},
		{"client names its own epoch", nil,
			checkCase{Principal: support, Headers: map[string]string{HeaderEpoch: "ep_test_1"}, Body: callBody("refund")}, "", false},
		{"same tool name on another server", nil,
			checkCase{Principal: support, ServerID: "payments", Body: callBody("refund")}, deny.NoSnapshot, false},
		{"billing's epoch on the payments route", nil,
			checkCase{Principal: support, ServerID: "payments", Headers: map[string]string{HeaderEpoch: "ep_test_1"}, Body: callBody("refund")}, deny.NoSnapshot, false},
		{"another session of the principal", nil,
			checkCase{Principal: support, Headers: map[string]string{"mcp-session-id": "other", "mcp-protocol-version": "2025-11-25"}, Body: callBody("refund")}, "", false},
		{"catalog refresh failing", func(t *testing.T, f *fixture) { f.billing.push(t, "", errors.New("connection refused")) },
			checkCase{Principal: support, Body: callBody("refund")}, deny.CatalogUnavailable, false},
		{"catalog too old", func(t *testing.T, f *fixture) { f.clock.advance(2*time.Minute + time.Second) },
			checkCase{Principal: support, Body: callBody("refund")}, deny.CatalogUnavailable, false},
		{"tool not granted is not drift", nil,
			checkCase{Principal: support, Body: callBody("export_ledger")}, deny.UnclassifiedTool, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			epoch := f.list(t, support, "billing", nil)
			if epoch != "ep_test_1" {
				t.Fatalf("first epoch %q", epoch)
			}
			if tt.change != nil {
				tt.change(t, f)
			}
			got := f.call(t, tt.call)
			if got.reason != tt.want {
				t.Fatalf("reason %q (%s), want %q", got.reason, got.data.Detail, tt.want)
			}
			if tt.want == "" {
				if got.upstream[HeaderEpoch] != epoch || got.upstream[HeaderSchemaDigest] == "" {
					t.Fatalf("allowed without pinning the epoch and digest upstream: %v", got.upstream)
				}
				return
			}
			if (got.drift != "") != tt.drift || (tt.drift && got.drift != string(tt.want)) || got.data.Drift != tt.drift {
				t.Errorf("x-capability-drift %q, data.capability_drift %v; want drift=%v", got.drift, got.data.Drift, tt.drift)
			}
			if got.data.ReturnTo != tt.want.ReturnTo() {
				t.Errorf("return_to %q, want %q", got.data.ReturnTo, tt.want.ReturnTo())
			}
		})
	}
}

// A schema drift denial names both digests and the epoch, so the caller and
// the audit can see exactly what moved.
func TestSchemaDriftData(t *testing.T) {
	f := newFixture(t)
	epoch := f.list(t, support, "billing", nil)
	before := f.call(t, checkCase{Principal: support, Body: callBody("refund")}).upstream[HeaderSchemaDigest]
	f.billing.push(t, "testdata/catalog-skip-fraud.json", nil)
	got := f.call(t, checkCase{Principal: support, Body: callBody("refund")})
	if got.data.Epoch != epoch || got.data.SnapshotDigest != before || got.data.LiveDigest == "" || got.data.LiveDigest == before {
		t.Fatalf("data %+v: want epoch %s, snapshot digest %s and a different live digest", got.data, epoch, before)
	}
	if got.data.ReturnTo != deny.ReturnToPlanning {
		t.Fatalf("return_to %q", got.data.ReturnTo)
	}
	// Listing again mints a new epoch over the new contract, and the same
	// call passes under it.
	next := f.list(t, support, "billing", nil)
	if next == epoch {
		t.Fatal("relisting reused the stale epoch")
	}
	again := f.call(t, checkCase{Principal: support, Body: callBody("refund")})
	if again.reason != "" || again.upstream[HeaderSchemaDigest] != got.data.LiveDigest {
		t.Fatalf("after relisting: %+v", again)
	}
}

// Two servers serve "refund" with different contracts; each call is held
// to its own server's digest.
func TestSameNameOnTwoServers(t *testing.T) {
	f := newFixture(t)
	f.list(t, support, "billing", nil)
	f.list(t, support, "payments", nil)
	b := f.call(t, checkCase{Principal: support, Body: callBody("refund")})
	p := f.call(t, checkCase{Principal: support, ServerID: "payments", Body: paymentsRefund})
	if b.reason != "" || p.reason != "" {
		t.Fatalf("denied: billing %q, payments %q", b.reason, p.reason)
	}
	if b.upstream[HeaderSchemaDigest] == p.upstream[HeaderSchemaDigest] || b.upstream[HeaderServerID] != "billing" || p.upstream[HeaderServerID] != "payments" {
		t.Fatalf("billing pinned %v, payments pinned %v", b.upstream, p.upstream)
	}
	// payments redeploys; billing's refund is unaffected.
	f.payments.push(t, "testdata/catalog-skip-fraud.json", nil)
	if got := f.call(t, checkCase{Principal: support, ServerID: "payments", Body: paymentsRefund}); got.reason != deny.SchemaDrift {
		t.Fatalf("payments after redeploy: %q", got.reason)
	}
	if got := f.call(t, checkCase{Principal: support, Body: callBody("refund")}); got.reason != "" {
		t.Fatalf("billing after payments redeployed: %q", got.reason)
	}
}

// Stale reads are off by default; when on, only a pinned read passes on the
// snapshot alone, and the audit says so.
func TestStaleReads(t *testing.T) {
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprint("allow=", allow), func(t *testing.T) {
			f := newFixture(t, func(o *Options) { o.Freshness.AllowStaleReads = allow })
			f.list(t, support, "billing", nil)
			f.billing.push(t, "", errors.New("connection refused"))
			read := f.call(t, checkCase{Principal: support, Body: callBody("lookup_order")})
			money := f.call(t, checkCase{Principal: support, Body: callBody("refund")})
			if money.reason != deny.CatalogUnavailable {
				t.Errorf("refund with the catalog down: %q, want catalog_unavailable", money.reason)
			}
			want := deny.CatalogUnavailable
			if allow {
				want = ""
			}
			if read.reason != want {
				t.Errorf("lookup_order with the catalog down: %q, want %q", read.reason, want)
			}
			if allow != bytes.Contains(f.audit.Bytes(), []byte(`"stale_catalog_read":true`)) {
				t.Errorf("audit marks a stale read: %v, want %v", !allow, allow)
			}
		})
	}
}

// Discovery with the catalog unavailable mints nothing: a snapshot is never
// taken from a view capsnap cannot vouch for.
func TestNoMintWithoutCatalog(t *testing.T) {
	f := newFixture(t)
	f.billing.push(t, "", errors.New("connection refused"))
	got := f.call(t, checkCase{Principal: support, Body: listBody})
	if got.reason != deny.CatalogUnavailable {
		t.Fatalf("tools/list with the catalog down: %q", got.reason)
	}
}

func mustRules(t testing.TB, path string) *Rules {
	t.Helper()
	r, err := LoadRules(path)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A denial's body must be a JSON-RPC error for the request's own id, with
// capsnap's code and the reason in data, or an MCP client cannot act on it.
func TestDeniedBodyIsJSONRPCError(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		body   string
		id     string
		reason deny.Reason
	}{
		{`{"jsonrpc":"2.0","id":"abc","method":"tools/call","params":{"name":"nope","arguments":{}}}`, `"abc"`, deny.NoSnapshot},
		{`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"export_ledger"}}`, `42`, deny.NoSnapshot},
		{`not json`, `null`, deny.MalformedRequest},
		// Refused, but for its own id, which could be read.
		{`{"jsonrpc":"2.0","id":"m-1","method":"Tools/Call","params":{"name":"refund"}}`, `"m-1"`, deny.MalformedRequest},
	} {
		resp, _ := f.Check(t.Context(), checkCase{Principal: support, Body: tc.body}.request())
		denied := resp.GetDeniedResponse()
		if denied == nil {
			t.Fatalf("%s: allowed", tc.body)
		}
		var msg struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Error   struct {
				Code int       `json:"code"`
				Data errorData `json:"data"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(denied.Body), &msg); err != nil {
			t.Fatalf("%s: body %q: %v", tc.body, denied.Body, err)
		}
		if msg.JSONRPC != "2.0" || string(msg.ID) != tc.id || msg.Error.Code != CodeDenied || msg.Error.Data.Reason != tc.reason {
			t.Errorf("%s: got %s", tc.body, denied.Body)
		}
	}
}

// Each denial form answers with the status and body the SDK table of
// docs/DENIALS.md promises: a 200 with the JSON-RPC error by default, the 4xx under
// http_error, a tool result for a denied call under tool_result; a request
// whose id is unknown always gets the 4xx, never a 200 for id null.
func TestDenialForms(t *testing.T) {
	const (
		call      = `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"wipe","arguments":{}}}`
		list      = `{"jsonrpc":"2.0","id":10,"method":"tools/list","params":{}}`
		malformed = `{"jsonrpc":"2.0","id":11,"id":12,"method":"tools/call"}`
	)
	tests := []struct {
		name, status, form, body string
		server                   string
		wantStatus               typev3.StatusCode
		wantResult               bool
		wantID                   string
		reason                   deny.Reason
	}{
		{"default call", config.StatusOK, config.CallFormError, call, "", typev3.StatusCode_OK, false, "9", deny.NoSnapshot},
		{"default list", config.StatusOK, config.CallFormError, list, "nowhere", typev3.StatusCode_OK, false, "10", deny.UnknownServer},
		{"default malformed", config.StatusOK, config.CallFormError, malformed, "", typev3.StatusCode_BadRequest, false, "null", deny.MalformedRequest},
		{"http_error call", config.StatusHTTPError, config.CallFormError, call, "", typev3.StatusCode_Forbidden, false, "9", deny.NoSnapshot},
		{"http_error list", config.StatusHTTPError, config.CallFormError, list, "nowhere", typev3.StatusCode_Forbidden, false, "10", deny.UnknownServer},
		{"tool_result call", config.StatusOK, config.CallFormToolResult, call, "", typev3.StatusCode_OK, true, "9", deny.NoSnapshot},
		{"tool_result list stays an error", config.StatusOK, config.CallFormToolResult, list, "nowhere", typev3.StatusCode_OK, false, "10", deny.UnknownServer},
		{"tool_result malformed stays an error", config.StatusOK, config.CallFormToolResult, malformed, "", typev3.StatusCode_BadRequest, false, "null", deny.MalformedRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, func(o *Options) { o.Denials.Status, o.Denials.CallForm = tt.status, tt.form })
			resp, err := f.Check(t.Context(), checkCase{Principal: support, ServerID: tt.server, Body: tt.body}.request())
			if err != nil {
				t.Fatal(err)
			}
			d := onTheWire(t, resp).GetDeniedResponse()
			if d == nil {
				t.Fatal("allowed")
			}
			if d.GetStatus().GetCode() != tt.wantStatus {
				t.Errorf("status %v, want %v", d.GetStatus().GetCode(), tt.wantStatus)
			}
			reason := ""
			for _, h := range d.GetHeaders() {
				if h.GetHeader().GetKey() == HeaderReason {
					reason = h.GetHeader().GetValue()
				}
			}
			if reason != string(tt.reason) {
				t.Errorf("x-capsnap-reason %q, want %q", reason, tt.reason)
			}
			var msg struct {
				ID     json.RawMessage `json:"id"`
				Error  *struct{ Data errorData }
				Result *struct {
					Content []struct{ Type, Text string }
					IsError bool                 `json:"isError"`
					Meta    map[string]errorData `json:"_meta"`
				}
			}
			if err := json.Unmarshal([]byte(d.GetBody()), &msg); err != nil {
				t.Fatalf("body %q: %v", d.GetBody(), err)
			}
			if string(msg.ID) != tt.wantID {
				t.Errorf("id %s, want %s", msg.ID, tt.wantID)
			}
			switch {
			case tt.wantResult && (msg.Result == nil || msg.Error != nil):
				t.Fatalf("want a tool result, got %s", d.GetBody())
			case tt.wantResult:
				r := msg.Result
				if !r.IsError || len(r.Content) != 1 || r.Content[0].Type != "text" || !strings.Contains(r.Content[0].Text, string(tt.reason)) ||
					r.Meta[MetaKeyDenial].Reason != tt.reason || r.Meta[MetaKeyDenial].ReturnTo != tt.reason.ReturnTo() {
					t.Errorf("tool result %s", d.GetBody())
				}
			case msg.Error == nil || msg.Result != nil || msg.Error.Data.Reason != tt.reason:
				t.Errorf("want a JSON-RPC error with reason %s, got %s", tt.reason, d.GetBody())
			}
		})
	}
}

// The tool-result form of a drift denial, byte for byte: what a model reads.
func TestToolResultGolden(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Denials.CallForm = config.CallFormToolResult })
	f.list(t, support, "billing", nil)
	f.billing.push(t, "testdata/catalog-skip-fraud.json", nil)
	resp, err := f.Check(t.Context(), checkCase{Principal: support, Body: callBody("refund")}.request())
	if err != nil {
		t.Fatal(err)
	}
	got := []byte(onTheWire(t, resp).GetDeniedResponse().GetBody() + "\n")
	golden := filepath.Join("testdata", "golden", "form_tool_result_drift.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("tool result differs from %s:\ngot  %s\nwant %s", golden, got, want)
	}
}

// A snapshot is the principal's: a call from its next session (after a
// reconnect) is held to the newest it listed in any session; another
// principal has none.
func TestNoSnapshotDetail(t *testing.T) {
	f := newFixture(t)
	session := func(id string) map[string]string {
		return map[string]string{"mcp-session-id": id, "mcp-protocol-version": "2025-11-25"}
	}
	f.list(t, support, "billing", session("session-a"))
	for _, tt := range []struct {
		name, principal, session, want string
	}{
		{"listed session", support, "session-a", ""},
		{"the principal's next session", support, "session-b", ""},
		{"another principal", auditor, "session-a", "no snapshot for this principal on server \"billing\""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := f.call(t, checkCase{Principal: tt.principal, Headers: session(tt.session), Body: callBody("lookup_order")})
			switch {
			case tt.want == "" && got.reason != "":
				t.Fatalf("denied %s: %s", got.reason, got.data.Detail)
			case tt.want != "" && (got.reason != deny.NoSnapshot || !strings.HasPrefix(got.data.Detail, tt.want)):
				t.Fatalf("%s: %q, want no_snapshot %q", got.reason, got.data.Detail, tt.want)
			}
		})
	}
}

func TestPrincipalSources(t *testing.T) {
	const who = support
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
			f := newFixture(t, func(o *Options) { o.Principal.Source = tt.source })
			c := checkCase{Principal: tt.peer, Body: listBody}
			if tt.header != "" {
				c.Headers = map[string]string{f.principal.Header: tt.header}
			}
			req := c.request()
			req.Attributes.MetadataContext = tt.meta
			resp, err := f.Check(t.Context(), req)
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
	f := newFixture(t)
	f.list(t, support, "billing", nil)
	allow := checkCase{Principal: support, Body: callBody("refund")}
	deny1 := checkCase{Principal: support, ServerID: "not-configured", Body: listBody}
	for _, c := range []checkCase{allow, allow, deny1} {
		f.call(t, c)
	}
	if got := testutil.ToFloat64(f.metrics.decisions.WithLabelValues("allow", "ok", "billing", "money_move", "enforce")); got != 2 {
		t.Errorf("allow count = %v, want 2", got)
	}
	// An unconfigured server_id from a route must not mint a new label value.
	if got := testutil.ToFloat64(f.metrics.decisions.WithLabelValues("deny", "unknown_server", "unknown", "none", "enforce")); got != 1 {
		t.Errorf("deny count = %v, want 1", got)
	}
	if hits, misses := testutil.ToFloat64(f.metrics.hits), testutil.ToFloat64(f.metrics.misses); hits != 2 || misses != 0 {
		t.Errorf("snapshot lookups: %v hits, %v misses; want 2 and 0", hits, misses)
	}
	lines := bytes.Split(bytes.TrimSpace(f.audit.Bytes()), []byte("\n"))
	if len(lines) != 5 {
		t.Fatalf("%d audit lines, want 5 (list and its response, two calls, one denial)", len(lines))
	}
	var call map[string]any
	if err := json.Unmarshal(lines[2], &call); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"decision": "allow", "reason": "ok", "tool": "refund", "server_id": "billing",
		"effect_class": "money_move", "request_id": "rid-", "jsonrpc_id": 1.0, "epoch": "ep_test_1"} {
		if call[k] != want {
			t.Errorf("audit %s = %v, want %v", k, call[k], want)
		}
	}
	if d, _ := call["snapshot_digest"].(string); len(d) != len("sha256:")+64 {
		t.Errorf("audit snapshot_digest = %v", call["snapshot_digest"])
	}
}

// Decisions counted at once from many goroutines all land in the one
// series of their labels.
func TestDecisionCountersConcurrent(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	l := decisionLabels{"deny", "schema_drift", "billing", "money_move", "enforce"}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				m.decided(l)
			}
		})
	}
	wg.Wait()
	if got := testutil.ToFloat64(m.decisions.WithLabelValues(l.decision, l.reason, l.serverID, l.effect, l.mode)); got != 4000 {
		t.Fatalf("count = %v, want 4000", got)
	}
	if n := testutil.CollectAndCount(m.decisions); n != 1 {
		t.Fatalf("%d series, want 1", n)
	}
}

func testutilCount(f *fixture, result string) float64 {
	return testutil.ToFloat64(f.metrics.reloads.WithLabelValues(result))
}

// Allowed calls of one pinned definition share the headers that depend on
// it alone, and each still carries its own snapshot's epoch; a call of
// another tool gets its own.
func TestAllowedCallsSharePinHeaders(t *testing.T) {
	f := newFixture(t)
	check := func(epoch, tool string) *authv3.CheckResponse {
		t.Helper()
		resp, err := f.Check(t.Context(), checkCase{Principal: support, Body: callBody(tool), Headers: map[string]string{HeaderEpoch: epoch}}.request())
		if err != nil || resp.GetOkResponse() == nil {
			t.Fatalf("%s under %s: %v, %v", tool, epoch, resp, err)
		}
		return resp
	}
	first, second := f.list(t, support, "billing", nil), f.list(t, support, "billing", nil)
	a, b := check(first, "refund"), check(second, "refund")
	other := check(second, "lookup_order")
	ha, hb, ho := a.GetOkResponse().Headers, b.GetOkResponse().Headers, other.GetOkResponse().Headers
	if len(ha) != 7 || len(hb) != 7 {
		t.Fatalf("%d and %d headers, want 7", len(ha), len(hb))
	}
	for i := range 5 {
		if ha[i] != hb[i] {
			t.Errorf("header %s is not shared between two calls of the same pin", ha[i].GetHeader().GetKey())
		}
		if ha[i] == ho[i] {
			t.Errorf("header %s is shared with another tool's call", ha[i].GetHeader().GetKey())
		}
	}
	upstream := func(h []*corev3.HeaderValueOption, key string) string {
		for _, o := range h {
			if o.GetHeader().GetKey() == key {
				return o.GetHeader().GetValue()
			}
		}
		return ""
	}
	if upstream(ha, HeaderEpoch) != first || upstream(hb, HeaderEpoch) != second || upstream(ho, HeaderTool) != "lookup_order" {
		t.Errorf("epochs %q, %q (want %q, %q); other tool %q", upstream(ha, HeaderEpoch), upstream(hb, HeaderEpoch), first, second, upstream(ho, HeaderTool))
	}
}
