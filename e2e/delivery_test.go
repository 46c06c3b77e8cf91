//go:build e2e

//lint:file-ignore SA1019 agents that declare roots and sampling, deprecated by 2026-07-28 and still what servers key tools on for older clients

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/lockfile"
	"github.com/capsnap/capsnap/testbed"
)

// The response path: what an agent's tools/list delivers through the real
// Envoy, where capsnap's ext_proc service pins and rewrites it. Every stack
// here runs testbed/cmd/mcpfixture as both of its servers.

// deliveryAgent is the principal the delivery policy grants.
const deliveryAgent = "spiffe://acme/agent/delivery"

// deliveryPolicy classifies every fixture tool but export_ledger, and grants
// deliveryAgent all of them but wipe_ledger (and export_ledger, which no
// grant can name while it is unclassified).
const deliveryPolicy = `tools:
  - {server: billing, tool: lookup_order, effect: read}
  - {server: billing, tool: refund, effect: money_move}
  - {server: billing, tool: summarize, effect: read}
  - {server: billing, tool: slow_report, effect: read}
  - {server: billing, tool: wipe_ledger, effect: admin}
principals:
  - id: spiffe://acme/agent/delivery
    grants:
      - {server: billing, tools: [lookup_order, refund, summarize, slow_report]}
`

// Every fixture tool, and what deliveryPolicy grants.
var (
	deliveryFixtureTools = []string{"export_ledger", "lookup_order", "refund", "slow_report", "summarize", "wipe_ledger"}
	deliveryGrants       = []string{"lookup_order", "refund", "slow_report", "summarize"}
)

// deliveryArgs are valid arguments for each fixture tool.
var deliveryArgs = map[string]map[string]any{
	"lookup_order":  {"order_id": "A-100"},
	"refund":        {"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"},
	"summarize":     {"text": "A long text."},
	"slow_report":   {},
	"export_ledger": {"format": "csv"},
	"wipe_ledger":   {"confirm": true},
}

// The fixture's malformed mode (see testbed/cmd/mcpfixture).
const (
	deliveryMalformedHeader = "x-fixture-malformed"
	deliveryMalformedMarker = "mcpfixture-malformed-body"
)

// The two ways a session binds to a snapshot: an MCP session (initialize,
// Mcp-Session-Id), and 2026-07-28's stateless requests.
var deliveryVersions = []string{"2025-11-25", "2026-07-28"}

const deliveryTimeout = 30 * time.Second

// deliveryAdmin asks the fixture and capsnap's admin listener, directly.
var deliveryAdmin = &http.Client{Timeout: 10 * time.Second}

var (
	deliveryFixtureOnce sync.Once
	deliveryFixtureBin  string
	deliveryFixtureErr  error
)

// deliveryFixture builds testbed/cmd/mcpfixture once, beside the binaries
// TestMain built (and removes).
func deliveryFixture(t *testing.T) string {
	t.Helper()
	deliveryFixtureOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		var b map[string]string
		b, deliveryFixtureErr = testbed.Build(ctx, filepath.Dir(bins["capsnap"]), "github.com/capsnap/capsnap/testbed/cmd/mcpfixture")
		deliveryFixtureBin = b["mcpfixture"]
	})
	if deliveryFixtureErr != nil {
		t.Fatal(deliveryFixtureErr)
	}
	return deliveryFixtureBin
}

// deliveryStack runs the stack with the fixture serving variant as both
// servers, under deliveryPolicy; edit, if set, adjusts the options further.
func deliveryStack(t *testing.T, variant string, edit func(*testbed.StackOptions)) *testbed.Stack {
	t.Helper()
	bin := deliveryFixture(t)
	return startStackWith(t, func(o *testbed.StackOptions) {
		o.Billing, o.ServerArgs, o.Policy = bin, []string{"-mode", variant}, []byte(deliveryPolicy)
		if edit != nil {
			edit(o)
		}
	})
}

// deliveryExchange is one HTTP request an agent made and what it got back.
type deliveryExchange struct {
	// Method is the JSON-RPC method of a POST's body (else the HTTP
	// method), ID its id.
	Method string
	ID     json.RawMessage
	Status int
	Header http.Header

	mu   sync.Mutex
	body bytes.Buffer
}

// Body is what the agent read of the response so far (all of it for a
// non-2xx response).
func (e *deliveryExchange) Body() []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return bytes.Clone(e.body.Bytes())
}

// deliveryRecorder keeps every exchange an agent's transport makes, the
// response bodies as the client reads them.
type deliveryRecorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	log  []*deliveryExchange
}

func (r *deliveryRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	ex := &deliveryExchange{Method: req.Method}
	// The SDK sends some requests (the GET stream's) under its
	// connection's context, which no test's deadline bounds.
	ctx, cancel := context.WithCancel(req.Context())
	timer := time.AfterFunc(deliveryHeaderTimeout, cancel)
	req = req.Clone(ctx)
	if req.Body != nil {
		body, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			timer.Stop()
			cancel()
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(body, &msg) == nil && msg.Method != "" {
			ex.Method, ex.ID = msg.Method, msg.ID
		}
	}
	resp, err := r.next.RoundTrip(req)
	if !timer.Stop() {
		if err == nil {
			resp.Body.Close()
		}
		err = fmt.Errorf("%s %s: no response headers within %v (%v)", req.Method, ex.Method, deliveryHeaderTimeout, err)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	ex.Status, ex.Header = resp.StatusCode, resp.Header.Clone()
	if resp.StatusCode/100 != 2 {
		// The client may never read an error's body: read it here.
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		cancel()
		ex.body.Write(b)
		resp.Body = io.NopCloser(bytes.NewReader(b))
	} else {
		resp.Body = &deliveryTee{ReadCloser: resp.Body, ex: ex, cancel: cancel}
	}
	r.mu.Lock()
	r.log = append(r.log, ex)
	r.mu.Unlock()
	return resp, nil
}

// deliveryHeaderTimeout bounds how long an agent's request waits for its
// response's headers (a body, such as the GET stream's, may last longer).
const deliveryHeaderTimeout = 10 * time.Second

type deliveryTee struct {
	io.ReadCloser
	ex     *deliveryExchange
	cancel context.CancelFunc
}

func (b *deliveryTee) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

func (b *deliveryTee) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.ex.mu.Lock()
	b.ex.body.Write(p[:n])
	b.ex.mu.Unlock()
	return n, err
}

// last is the latest exchange of JSON-RPC method.
func (r *deliveryRecorder) last(t *testing.T, method string) *deliveryExchange {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.log) - 1; i >= 0; i-- {
		if r.log[i].Method == method {
			return r.log[i]
		}
	}
	t.Fatalf("the agent made no %s request", method)
	return nil
}

// deliveryClient is one agent's MCP session through Envoy, on the Go SDK.
type deliveryClient struct {
	cs    *mcp.ClientSession
	agent *testbed.Agent
	rec   *deliveryRecorder
}

type deliveryOpts struct {
	// sampling declares the sampling capability.
	sampling bool
	// progress receives the client's progress notifications.
	progress func(*mcp.ProgressNotificationParams)
}

// deliveryDial opens a session to url as principal at version, through a
// recorder.
func deliveryDial(t *testing.T, url, principal, version string, o deliveryOpts) *deliveryClient {
	t.Helper()
	co := &mcp.ClientOptions{}
	if o.sampling {
		co.CreateMessageHandler = func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			return &mcp.CreateMessageResult{Model: "none", Role: "assistant", Content: &mcp.TextContent{Text: "no"}}, nil
		}
	}
	if o.progress != nil {
		co.ProgressNotificationHandler = func(_ context.Context, r *mcp.ProgressNotificationClientRequest) { o.progress(r.Params) }
	}
	return dialRecorded(t, url, principal, version, version, co)
}

// dialRecorded opens a session to url as principal with co, asking for
// version ("" for the SDK's default), through a recorder, and fails
// unless the session negotiated want.
func dialRecorded(t *testing.T, url, principal, version, want string, co *mcp.ClientOptions) *deliveryClient {
	t.Helper()
	a := testbed.NewAgent(principal)
	rec := &deliveryRecorder{next: a}
	c := mcp.NewClient(&mcp.Implementation{Name: "capsnap-e2e", Version: "1"}, co)
	ctx, cancel := context.WithTimeout(context.Background(), deliveryTimeout)
	defer cancel()
	// No retries: a stream that breaks is a failure here, and a retried
	// one would stretch a hung test.
	transport := &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: rec}, MaxRetries: -1}
	cs, err := c.Connect(ctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect %s as %s at %q: %v", url, principal, version, err)
	}
	t.Cleanup(func() { cs.Close() })
	if got := cs.InitializeResult().ProtocolVersion; got != want {
		t.Fatalf("asked for %q, negotiated protocol version %s, want %s", version, got, want)
	}
	return &deliveryClient{cs: cs, agent: a, rec: rec}
}

func deliveryDialAgent(t *testing.T, s *testbed.Stack, version string, o deliveryOpts) *deliveryClient {
	t.Helper()
	return deliveryDial(t, s.MCPURL(), deliveryAgent, version, o)
}

// page lists one page of tools from cursor, and returns the delivered names
// and the next cursor. The agent then names the epoch capsnap returned on
// every later request, as an agent that plans under its list does.
func (c *deliveryClient) page(t *testing.T, cursor string) ([]string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deliveryTimeout)
	defer cancel()
	before := c.agent.Epoch()
	res, err := c.cs.ListTools(ctx, &mcp.ListToolsParams{Cursor: cursor})
	if err != nil {
		t.Fatalf("tools/list (cursor %q): %v", cursor, err)
	}
	ex := c.rec.last(t, "tools/list")
	epoch := ex.Header.Get(testbed.EpochHeader)
	if !strings.HasPrefix(epoch, "ep_") || epoch == before {
		t.Fatalf("tools/list (cursor %q): epoch header %q (the one before: %q), want a new ep_ epoch", cursor, epoch, before)
	}
	c.agent.Send(testbed.EpochHeader, epoch)
	names := make([]string, 0, len(res.Tools))
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	return names, res.NextCursor
}

// listAll lists every page and returns the delivered names, sorted.
func (c *deliveryClient) listAll(t *testing.T) []string {
	t.Helper()
	var all []string
	cursor := ""
	for range 20 {
		names, next := c.page(t, cursor)
		all = append(all, names...)
		if next == "" {
			slices.Sort(all)
			return all
		}
		cursor = next
	}
	t.Fatal("tools/list: more than 20 pages")
	return nil
}

// deliveryOutcome is how a tools/call ended: "" allowed (and the tool answered),
// capsnap's denial reason, "tool_error: ..." for the server's own refusal,
// or "error: ..." for anything else.
func deliveryOutcome(res *mcp.CallToolResult, err error) (string, *jsonrpc.Error) {
	if err == nil {
		if res.IsError {
			msg := ""
			if len(res.Content) > 0 {
				if tc, ok := res.Content[0].(*mcp.TextContent); ok {
					msg = tc.Text
				}
			}
			return "tool_error: " + msg, nil
		}
		return "", nil
	}
	var werr *jsonrpc.Error
	if !errors.As(err, &werr) {
		return "error: " + err.Error(), nil
	}
	var data struct {
		Reason string `json:"reason"`
	}
	if werr.Code != -31000 || json.Unmarshal(werr.Data, &data) != nil || data.Reason == "" {
		return fmt.Sprintf("error: JSON-RPC %d %s", werr.Code, werr.Message), werr
	}
	return data.Reason, werr
}

func (c *deliveryClient) call(t *testing.T, tool string) (string, *jsonrpc.Error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deliveryTimeout)
	defer cancel()
	res, err := c.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: deliveryArgs[tool]})
	return deliveryOutcome(res, err)
}

// deliveryFixtureStats is what the fixture reports of itself.
type deliveryFixtureStats struct {
	HandlerStarts   map[string]int `json:"handler_starts"`
	MalformedServed int            `json:"malformed_served"`
}

func deliveryStats(t *testing.T, s *testbed.Stack) deliveryFixtureStats {
	t.Helper()
	var st deliveryFixtureStats
	resp, err := deliveryAdmin.Get(s.ServerURL("billing") + "/admin/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// mustAllow calls tool and fails unless capsnap allowed it and its handler
// ran exactly once.
func (c *deliveryClient) mustAllow(t *testing.T, s *testbed.Stack, tool string) {
	t.Helper()
	before := deliveryStats(t, s).HandlerStarts[tool]
	if r, _ := c.call(t, tool); r != "" {
		t.Fatalf("%s: %q, want it allowed", tool, r)
	}
	if got := deliveryStats(t, s).HandlerStarts[tool] - before; got != 1 {
		t.Fatalf("%s: allowed, but its handler started %d times", tool, got)
	}
}

// mustDeny calls tool and fails unless capsnap denied it with want and the
// handler never started; it returns the JSON-RPC error.
func (c *deliveryClient) mustDeny(t *testing.T, s *testbed.Stack, tool, want string) *jsonrpc.Error {
	t.Helper()
	before := deliveryStats(t, s).HandlerStarts[tool]
	r, werr := c.call(t, tool)
	if r != want {
		t.Fatalf("%s: %q, want capsnap's %s", tool, r, want)
	}
	if got := deliveryStats(t, s).HandlerStarts[tool] - before; got != 0 {
		t.Fatalf("%s: denied %s, but its handler started %d times", tool, want, got)
	}
	return werr
}

// deliveryUpstreamTools lists billing's tools straight from the fixture,
// bypassing Envoy: what an agent would be delivered with nobody in between.
func deliveryUpstreamTools(t *testing.T, s *testbed.Stack, sampling bool) []string {
	t.Helper()
	c := deliveryDial(t, s.ServerURL("billing")+"/mcp", deliveryAgent, "2025-11-25", deliveryOpts{sampling: sampling})
	ctx, cancel := context.WithTimeout(context.Background(), deliveryTimeout)
	defer cancel()
	var names []string
	cursor := ""
	for {
		res, err := c.cs.ListTools(ctx, &mcp.ListToolsParams{Cursor: cursor})
		if err != nil {
			t.Fatalf("tools/list straight from the server: %v", err)
		}
		for _, tl := range res.Tools {
			names = append(names, tl.Name)
		}
		if cursor = res.NextCursor; cursor == "" {
			slices.Sort(names)
			return names
		}
	}
}

// deliveryCatalogTools are the tools in capsnap's own view of billing.
func deliveryCatalogTools(t *testing.T, s *testbed.Stack) []string {
	t.Helper()
	resp, err := deliveryAdmin.Get(s.AdminURL() + "/catalog")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var view map[string]testbed.CatalogServer
	if err := json.NewDecoder(resp.Body).Decode(&view); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range view["billing"].Tools {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names
}

func deliveryWithout(names []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return slices.Contains(drop, n) })
}

// Exactly what the policy grants (and the lockfile approves) is delivered;
// what it leaves unclassified or ungranted is withheld from the list, and
// a call to it is denied with the reason, naming what was delivered.
func TestDeliveredOnlyGranted(t *testing.T) {
	s := deliveryStack(t, "", nil)
	// The server offers everything: whatever is missing below, capsnap
	// withheld.
	if got := deliveryUpstreamTools(t, s, true); !slices.Equal(got, deliveryFixtureTools) {
		t.Fatalf("the fixture lists %v, want %v", got, deliveryFixtureTools)
	}
	check := func(t *testing.T, version string, granted []string, unapproved string) {
		c := deliveryDialAgent(t, s, version, deliveryOpts{sampling: true})
		delivered := c.listAll(t)
		if !slices.Equal(delivered, granted) {
			t.Fatalf("delivered %v, want exactly %v", delivered, granted)
		}
		withheld := []string{"export_ledger", "wipe_ledger"}
		if unapproved != "" {
			withheld = append(withheld, unapproved)
		}
		body := string(c.rec.last(t, "tools/list").Body())
		for _, tool := range withheld {
			if strings.Contains(body, tool) {
				t.Fatalf("the tools/list response names %s, which it must withhold:\n%s", tool, body)
			}
		}
		for _, tool := range granted {
			c.mustAllow(t, s, tool)
		}
		if unapproved != "" {
			c.mustDeny(t, s, unapproved, "tool_unapproved")
		}
		c.mustDeny(t, s, "export_ledger", "unclassified_tool")
		werr := c.mustDeny(t, s, "wipe_ledger", "tool_not_granted")
		var data struct {
			AllowedTools []string `json:"allowed_tools"`
		}
		if err := json.Unmarshal(werr.Data, &data); err != nil {
			t.Fatalf("error data %s: %v", werr.Data, err)
		}
		slices.Sort(data.AllowedTools)
		if !slices.Equal(data.AllowedTools, delivered) {
			t.Fatalf("tool_not_granted names allowed_tools %v, want what was delivered, %v", data.AllowedTools, delivered)
		}
	}
	for _, version := range deliveryVersions {
		t.Run(version, func(t *testing.T) { check(t, version, deliveryGrants, "") })
	}

	// With a lockfile that leaves slow_report out, slow_report waits for
	// review: granted, yet never delivered, and its call is unapproved.
	t.Run("lockfile", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), deliveryTimeout)
		defer cancel()
		lock := filepath.Join(s.Dir(), "capsnap.lock")
		if out, err := deliveryCapsnap(ctx, "lock", "--config", filepath.Join(s.Dir(), "capsnap.yaml"), "--out", lock); err != nil {
			t.Fatalf("capsnap lock: %v\n%s", err, out)
		}
		l, err := lockfile.Load(lock)
		if err != nil {
			t.Fatal(err)
		}
		entries := slices.DeleteFunc(l.Entries(), func(e lockfile.Entry) bool { return e.Tool == "slow_report" })
		if len(entries) != len(l.Entries())-2 {
			t.Fatalf("the lockfile has %d entries; want slow_report on both servers among them", len(l.Entries()))
		}
		b, err := lockfile.Marshal(entries)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(lock, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := s.ReloadPolicy(ctx, []byte("lockfile: capsnap.lock\n"+deliveryPolicy)); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(s.Capsnap.Output(), "policy reload refused") {
			t.Fatalf("adding a lockfile was refused:\n%s", s.Capsnap.Output())
		}
		for _, version := range deliveryVersions {
			t.Run(version, func(t *testing.T) { check(t, version, deliveryWithout(deliveryGrants, "slow_report"), "slow_report") })
		}
	})
}

// A tool the server offers only to clients that declare sampling: capsnap's
// own session declares it, so capsnap's view has the tool; an agent that
// declares it is delivered it and may call it, an agent that does not is
// never delivered it, and capsnap (not the server) denies its call.
func TestCapabilityGatedTool(t *testing.T) {
	s := deliveryStack(t, "", nil)
	if got := deliveryUpstreamTools(t, s, false); slices.Contains(got, "summarize") {
		t.Fatalf("the fixture offers summarize to a client without sampling: %v", got)
	}
	if got := deliveryCatalogTools(t, s); !slices.Equal(got, deliveryFixtureTools) {
		t.Fatalf("capsnap's view of billing is %v, want every tool %v (its session declares sampling)", got, deliveryFixtureTools)
	}
	for _, version := range deliveryVersions {
		t.Run(version, func(t *testing.T) {
			sampler := deliveryDialAgent(t, s, version, deliveryOpts{sampling: true})
			if got := sampler.listAll(t); !slices.Equal(got, deliveryGrants) {
				t.Fatalf("delivered to a client with sampling: %v, want %v", got, deliveryGrants)
			}
			sampler.mustAllow(t, s, "summarize")

			plain := deliveryDialAgent(t, s, version, deliveryOpts{})
			want := deliveryWithout(deliveryGrants, "summarize")
			if got := plain.listAll(t); !slices.Equal(got, want) {
				t.Fatalf("delivered to a client without sampling: %v, want %v", got, want)
			}
			// capsnap's view has summarize and the policy grants it, but
			// this agent's snapshot never pinned it.
			plain.mustDeny(t, s, "summarize", "no_snapshot")
			plain.mustAllow(t, s, "lookup_order")
			// The sampler's snapshot is its own.
			sampler.mustAllow(t, s, "summarize")
		})
	}
}

// A paginated list: each page pins what it delivered, on top of the pages
// before it, so a tool is callable from the page that delivered it on, and
// a tool from an earlier page stays callable.
func TestPagedList(t *testing.T) {
	s := deliveryStack(t, "pages=2", nil)
	for _, version := range deliveryVersions {
		t.Run(version, func(t *testing.T) {
			c := deliveryDialAgent(t, s, version, deliveryOpts{sampling: true})
			first, cursor := c.page(t, "")
			if cursor == "" {
				t.Fatalf("page 1 (%v) has no nextCursor: the fixture did not paginate", first)
			}
			if len(first) == 0 {
				t.Fatalf("page 1 delivered nothing")
			}
			// What page 1 did not deliver is not callable on its snapshot.
			for _, tool := range deliveryWithout(deliveryGrants, first...) {
				c.mustDeny(t, s, tool, "no_snapshot")
			}

			second, next := c.page(t, cursor)
			later := deliveryWithout(second, first...)
			if len(later) == 0 {
				t.Fatalf("page 2 delivered %v, nothing that page 1 (%v) did not", second, first)
			}
			for _, tool := range later {
				c.mustAllow(t, s, tool)
			}
			for _, tool := range first {
				c.mustAllow(t, s, tool)
			}

			all := append(slices.Clone(first), second...)
			for cursor = next; cursor != ""; {
				var names []string
				names, cursor = c.page(t, cursor)
				all = append(all, names...)
			}
			slices.Sort(all)
			if !slices.Equal(all, deliveryGrants) {
				t.Fatalf("the pages delivered %v in all, want %v", all, deliveryGrants)
			}
			for _, tool := range deliveryGrants {
				c.mustAllow(t, s, tool)
			}
			c.mustDeny(t, s, "export_ledger", "unclassified_tool")
		})
	}
}

// The same delivery over an SSE response and a JSON one: capsnap reads and
// rewrites both.
func TestSSEAndJSONLists(t *testing.T) {
	for _, tt := range []struct{ variant, contentType string }{
		{"", "text/event-stream"},
		{"json", "application/json"},
	} {
		t.Run(tt.contentType, func(t *testing.T) {
			s := deliveryStack(t, tt.variant, nil)
			for _, version := range deliveryVersions {
				t.Run(version, func(t *testing.T) {
					c := deliveryDialAgent(t, s, version, deliveryOpts{sampling: true})
					delivered := c.listAll(t)
					ex := c.rec.last(t, "tools/list")
					if ct := ex.Header.Get("Content-Type"); !strings.HasPrefix(ct, tt.contentType) {
						t.Fatalf("the tools/list response is %q, want %s", ct, tt.contentType)
					}
					if !slices.Equal(delivered, deliveryGrants) {
						t.Fatalf("delivered %v, want %v", delivered, deliveryGrants)
					}
					body := string(ex.Body())
					for _, withheld := range []string{"export_ledger", "wipe_ledger"} {
						if strings.Contains(body, withheld) {
							t.Fatalf("the %s response names %s:\n%s", tt.contentType, withheld, body)
						}
					}
					c.mustAllow(t, s, "refund")
					c.mustDeny(t, s, "export_ledger", "unclassified_tool")
					c.mustDeny(t, s, "wipe_ledger", "tool_not_granted")
				})
			}
		})
	}
}

// A list longer than discovery.max_response_bytes never reaches the agent:
// Envoy streams it to capsnap in full duplex, and capsnap reads no further
// than the bound and answers a JSON-RPC error in its place, over SSE and
// JSON alike.
func TestListOverTheBound(t *testing.T) {
	for _, variant := range []string{"", "json"} {
		t.Run("mode="+variant, func(t *testing.T) {
			s := deliveryStack(t, variant, func(o *testbed.StackOptions) { o.MaxResponseBytes = 1024 })
			resp, body := deliveryRawList(t, s, 7, nil)
			deliveryCheckMalformed(t, resp.StatusCode, resp.Header, body, json.RawMessage("7"))
			if bytes.Contains(body, []byte("lookup_order")) {
				t.Fatalf("the list reached the agent:\n%s", body)
			}
			if !strings.Contains(s.Capsnap.Output(), "over discovery.max_response_bytes 1024") {
				t.Fatal("capsnap's audit does not say the list was over the bound")
			}
		})
	}
}

// deliveryRawList posts one 2026-07-28 tools/list with id through Envoy, as
// an agent that sends extra headers.
func deliveryRawList(t *testing.T, s *testbed.Stack, id int, extra map[string]string) (*http.Response, []byte) {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`, id)
	h := map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"}
	for k, v := range extra {
		h[k] = v
	}
	return postWith(t, s, deliveryAgent, body, h)
}

func deliverySetMalformed(t *testing.T, s *testbed.Stack, on string) {
	t.Helper()
	resp, err := deliveryAdmin.Post(s.ServerURL("billing")+"/admin/malformed", "text/plain", strings.NewReader(on))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("malformed %s: %s", on, resp.Status)
	}
}

// deliveryCheckMalformed fails unless what the agent got for its tools/list
// of id is capsnap's malformed_response JSON-RPC error (a 200, the default
// denials.status), and none of the server's body.
func deliveryCheckMalformed(t *testing.T, status int, h http.Header, body []byte, id json.RawMessage) {
	t.Helper()
	if status != http.StatusOK || h.Get("x-capsnap-reason") != "malformed_response" {
		t.Fatalf("got %d, x-capsnap-reason %q; want 200 malformed_response\n%s", status, h.Get("x-capsnap-reason"), body)
	}
	if e := h.Get(testbed.EpochHeader); e != "" {
		t.Fatalf("a response capsnap could not read came with epoch %q", e)
	}
	if bytes.Contains(body, []byte(deliveryMalformedMarker)) || bytes.Contains(body, []byte("wipe_ledger")) {
		t.Fatalf("the server's malformed body reached the agent:\n%s", body)
	}
	var msg struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  json.RawMessage `json:"result"`
		Error   *struct {
			Code int `json:"code"`
			Data struct {
				Reason string `json:"reason"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &msg); err != nil {
		t.Fatalf("the body is not JSON: %v\n%s", err, body)
	}
	if msg.JSONRPC != "2.0" || string(msg.ID) != string(id) || msg.Result != nil || msg.Error == nil ||
		msg.Error.Code != -31000 || msg.Error.Data.Reason != "malformed_response" {
		t.Fatalf("the body is not capsnap's malformed_response JSON-RPC error for id %s:\n%s", id, body)
	}
}

// A tools/list response capsnap cannot read (not strict JSON) never reaches
// the agent: it gets a JSON-RPC error for its request instead, and no
// snapshot is minted from it.
func TestMalformedUpstreamList(t *testing.T) {
	s := deliveryStack(t, "", nil)
	deliverySetMalformed(t, s, "on")

	t.Run("SDK client", func(t *testing.T) {
		c := deliveryDialAgent(t, s, "2025-11-25", deliveryOpts{sampling: true})
		c.agent.Send(deliveryMalformedHeader, "1")
		served := deliveryStats(t, s).MalformedServed
		ctx, cancel := context.WithTimeout(context.Background(), deliveryTimeout)
		defer cancel()
		res, err := c.cs.ListTools(ctx, nil)
		if err == nil {
			t.Fatalf("tools/list of a malformed response succeeded: %v", res.Tools)
		}
		// The SDK surfaces capsnap's reason to the agent.
		if r := denialReason(t, err); r != "malformed_response" {
			t.Fatalf("the SDK client saw %q, want malformed_response", r)
		}
		if deliveryStats(t, s).MalformedServed != served+1 {
			t.Fatal("the fixture did not serve its malformed body")
		}
		ex := c.rec.last(t, "tools/list")
		deliveryCheckMalformed(t, ex.Status, ex.Header, ex.Body(), ex.ID)
		// Nothing was pinned from it.
		c.mustDeny(t, s, "lookup_order", "no_snapshot")

		// capsnap's own catalog session never sent the header: its view
		// is live, and the same session lists once the server answers well.
		c.agent.Send(deliveryMalformedHeader, "")
		if got := c.listAll(t); !slices.Equal(got, deliveryGrants) {
			t.Fatalf("after the malformed response: delivered %v, want %v", got, deliveryGrants)
		}
		c.mustAllow(t, s, "lookup_order")
	})

	t.Run("raw request", func(t *testing.T) {
		resp, body := deliveryRawList(t, s, 42, map[string]string{deliveryMalformedHeader: "1"})
		deliveryCheckMalformed(t, resp.StatusCode, resp.Header, body, json.RawMessage("42"))
		// The same request without the header is delivered.
		resp, body = deliveryRawList(t, s, 43, nil)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(testbed.EpochHeader) == "" || !bytes.Contains(body, []byte("lookup_order")) {
			t.Fatalf("a well-formed list: %s, epoch %q\n%s", resp.Status, resp.Header.Get(testbed.EpochHeader), body)
		}
	})
}

// The response of a tools/call is not buffered on the response path: the
// progress notifications of a running call reach the agent while the call
// runs.
func TestProgressStreamsThrough(t *testing.T) {
	s := deliveryStack(t, "", nil)
	for _, version := range deliveryVersions {
		t.Run(version, func(t *testing.T) {
			var (
				mu       sync.Mutex
				arrivals []time.Time
				tokens   []any
			)
			c := deliveryDialAgent(t, s, version, deliveryOpts{progress: func(p *mcp.ProgressNotificationParams) {
				mu.Lock()
				defer mu.Unlock()
				arrivals = append(arrivals, time.Now())
				tokens = append(tokens, p.ProgressToken)
			}})
			c.listAll(t)
			params := &mcp.CallToolParams{Name: "slow_report", Arguments: map[string]any{}}
			params.SetProgressToken("report-1")
			ctx, cancel := context.WithTimeout(context.Background(), deliveryTimeout)
			defer cancel()
			start := time.Now()
			res, err := c.cs.CallTool(ctx, params)
			done := time.Now()
			if r, _ := deliveryOutcome(res, err); r != "" {
				t.Fatalf("slow_report: %q", r)
			}
			// The SDK may hand a notification that came with the result
			// to its handler just after the result.
			for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				mu.Lock()
				n := len(arrivals)
				mu.Unlock()
				if n >= 5 {
					break
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if len(arrivals) != 5 {
				t.Fatalf("%d progress notifications arrived, want 5", len(arrivals))
			}
			for _, tok := range tokens {
				if tok != "report-1" {
					t.Fatalf("progress for token %v, want report-1", tok)
				}
			}
			first, last := arrivals[0], arrivals[len(arrivals)-1]
			t.Logf("progress at %v..%v, result at %v after the call", first.Sub(start), last.Sub(start), done.Sub(start))
			// The fixture sends them 150ms apart and answers 150ms after
			// the last: buffered, all would arrive with the result.
			if lead := done.Sub(first); lead < 300*time.Millisecond {
				t.Fatalf("the first progress arrived %v before the result, want over 300ms: the response was buffered", lead)
			}
			if spread := last.Sub(first); spread < 300*time.Millisecond {
				t.Fatalf("the progress notifications arrived within %v of each other, want them spread as sent", spread)
			}
		})
	}
}

// deliveryExtProcUnreachable is envoy/demo.yaml for p with only the ext_proc
// filter's gRPC service pointed at a cluster on a closed loopback port; the
// ext_authz filter still reaches capsnap.
func deliveryExtProcUnreachable(t *testing.T, p testbed.Ports) []byte {
	t.Helper()
	cfg := string(testbed.EnvoyConfig(p))
	const service = "envoy_grpc: {cluster_name: capsnap}"
	at := strings.Index(cfg, "name: envoy.filters.http.ext_proc")
	if at < 0 || strings.Count(cfg, service) != 2 || !strings.Contains(cfg[at:], service) {
		t.Fatal("envoy config: the ext_proc filter's capsnap service not found where expected")
	}
	closed, err := testbed.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg[:at] + strings.Replace(cfg[at:], service, "envoy_grpc: {cluster_name: ext_proc_unreachable}", 1)
	if !strings.HasSuffix(cfg, "\n") {
		cfg += "\n"
	}
	cfg += fmt.Sprintf(`  - name: ext_proc_unreachable
    type: STATIC
    connect_timeout: 0.25s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {}
    load_assignment:
      cluster_name: ext_proc_unreachable
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: %d}
`, closed)
	return []byte(cfg)
}

// With capsnap's ext_proc unreachable, every answer fails closed
// (status_on_error 503) and delivers no tools: capsnap screens every answer
// to a request it checked for a listing on a stream not its own, so none
// passes unscreened, an initialize's no more than a tools/list's.
func TestExtProcUnreachable(t *testing.T) {
	s := deliveryStack(t, "", func(o *testbed.StackOptions) { o.EnvoyYAML = deliveryExtProcUnreachable(t, o.Ports) })
	resp, body := deliveryRawList(t, s, 7, nil)
	deliveryCheckFailedClosed(t, resp.StatusCode, resp.Header, body)

	resp, body = postWith(t, s, deliveryAgent, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"e2e","version":"1"}}}`,
		map[string]string{"Mcp-Protocol-Version": "2025-11-25"})
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("initialize with ext_proc unreachable: %d, want 503\n%s", resp.StatusCode, body)
	}
}

func deliveryCheckFailedClosed(t *testing.T, status int, h http.Header, body []byte) {
	t.Helper()
	if status != http.StatusServiceUnavailable {
		t.Fatalf("tools/list with ext_proc unreachable: %d, want 503\n%s", status, body)
	}
	if e := h.Get(testbed.EpochHeader); e != "" {
		t.Fatalf("a failed list came with epoch %q", e)
	}
	for _, tool := range deliveryFixtureTools {
		if bytes.Contains(body, []byte(tool)) {
			t.Fatalf("the 503 names %s: the list leaked\n%s", tool, body)
		}
	}
}

// deliveryCapsnap runs the built capsnap with args.
func deliveryCapsnap(ctx context.Context, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, bins["capsnap"], args...).CombinedOutput()
}
