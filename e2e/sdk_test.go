//go:build e2e

package e2e

// Denials reach the planner in every official MCP SDK: the Go SDK in
// process, and the TypeScript and Python SDKs' real clients as programs
// (e2e/clients), each through the real Envoy to capsnap and the server.
// Each SDK runs the same scripted steps, and each asserts what its caller
// would see: the SDK's own MCP error with capsnap's code -31000 and its
// data, or (denials.call_form: tool_result) a tool result with isError.
//
// The clients are installed by e2e/clients/install.sh (make e2e runs it),
// and found through CAPSNAP_E2E_NODE and CAPSNAP_E2E_PYTHON; without them
// these tests fail, never skip.

import (
	"bufio"
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
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/examples/billing"
	"github.com/capsnap/capsnap/testbed"
)

// The SDK versions e2e/clients pins; a client that reports another was
// installed from something else.
const (
	sdkTSVersion     = "1.32.2"
	sdkPythonVersion = "2.3.0"
)

// sdkMetaDenial is the _meta member of a tool result that denies a call.
const sdkMetaDenial = "io.capsnap/denial"

// sdkStepTimeout bounds one step in the client; a subprocess gets
// sdkStepSlack more to answer it, and sdkProcTimeout bounds its whole life.
const (
	sdkStepTimeout = 20 * time.Second
	sdkStepSlack   = 15 * time.Second
	sdkProcTimeout = 3 * time.Minute
)

// sdkReq is one step of the clients' protocol (e2e/clients/ts/client.mjs).
type sdkReq struct {
	ID        string            `json:"id"`
	Op        string            `json:"op"`
	URL       string            `json:"url,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	API       string            `json:"api,omitempty"`
	Name      string            `json:"name,omitempty"`
	Arguments map[string]any    `json:"arguments,omitempty"`
	Progress  bool              `json:"progress,omitempty"`
	TimeoutMS int               `json:"timeout_ms,omitempty"`
	// ElicitationURL declares URL-mode elicitation at connect.
	ElicitationURL bool `json:"elicitation_url,omitempty"`
	// ElicitationApprove, with ElicitationURL, has the client's
	// elicitation handler play the person (Go, Python): it approves the
	// request at the URL it is asked to open, through this approval API,
	// and accepts.
	ElicitationApprove *sdkApprover `json:"elicitation_approve,omitempty"`
}

// sdkApprover is an approval API and an approver's token.
type sdkApprover struct {
	URL   string `json:"url"`
	Token string `json:"token"`
}

// sdkError is what an SDK threw or returned as an error.
type sdkError struct {
	Class   string          `json:"class"`
	Code    *int            `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
	// Sub are an exception group's members (Python).
	Sub []*sdkError `json:"sub"`
	// URLElicitations are a -32042's elicitations as the Python SDK's
	// UrlElicitationRequiredError.from_error reads them, or why it cannot.
	URLElicitations      json.RawMessage `json:"url_elicitations"`
	URLElicitationsError string          `json:"url_elicitations_error"`
	// BodyError is the JSON-RPC error a TypeScript StreamableHTTPError
	// carries only as text in its message, parsed by the client.
	BodyError json.RawMessage `json:"body_error"`
}

// mcpErr is the first error in e that has a code: e itself, or the first
// such member of its exception groups.
func (e *sdkError) mcpErr() *sdkError {
	if e == nil {
		return nil
	}
	if e.Code != nil {
		return e
	}
	for _, s := range e.Sub {
		if m := s.mcpErr(); m != nil {
			return m
		}
	}
	return nil
}

func (e *sdkError) String() string {
	if e == nil {
		return "no error"
	}
	code := "no code"
	if e.Code != nil {
		code = fmt.Sprintf("code %d", *e.Code)
	}
	s := fmt.Sprintf("%s (%s) %q", e.Class, code, e.Message)
	if len(e.Data) > 0 {
		s += " data " + string(e.Data)
	}
	if m := e.mcpErr(); m != nil && m != e {
		s += " wrapping " + m.String()
	}
	return s
}

// sdkHTTP is one HTTP request a client's transport made, and its answer.
type sdkHTTP struct {
	Method      string `json:"method"`
	HTTPMethod  string `json:"http_method"`
	Status      int    `json:"status"`
	ContentType string `json:"content_type"`
}

// sdkProgress is one notifications/progress as the caller's handler got it.
type sdkProgress struct {
	T        float64 `json:"t"`
	Progress float64 `json:"progress"`
	Total    float64 `json:"total"`
}

// sdkStep is a client's answer to one sdkReq.
type sdkStep struct {
	Step string          `json:"step"`
	Op   string          `json:"op"`
	OK   bool            `json:"ok"`
	Raw  json.RawMessage `json:"result"`
	// Tools are what a list delivered.
	Tools []string `json:"tools"`
	// Stream is what TypeScript's callToolStream yielded.
	Stream       []json.RawMessage `json:"stream"`
	Error        *sdkError         `json:"error"`
	OnerrorFired bool              `json:"onerror_fired"`
	Onerror      []string          `json:"onerror"`
	HTTP         []sdkHTTP         `json:"http"`
	StartedAt    float64           `json:"started_at"`
	FinishedAt   float64           `json:"finished_at"`
	// Of a connect.
	SDK             json.RawMessage `json:"sdk"`
	Runtime         string          `json:"runtime"`
	ProtocolVersion string          `json:"protocol_version"`
	SessionID       string          `json:"session_id"`
	// Progress are the notifications a call with Progress got.
	Progress []sdkProgress `json:"-"`
	// Elicited are the elicitations a call's handler was asked.
	Elicited []sdkElicited `json:"elicited"`
	// Honored is the filter the server acknowledged (listen); Change the
	// change event's class (next_event), such as ToolsListChanged.
	Honored json.RawMessage `json:"honored"`
	Change  string          `json:"change"`
}

// sdkElicited is one elicitation a client's handler was asked, and the
// approval API's status when it played the person.
type sdkElicited struct {
	Mode     string `json:"mode"`
	URL      string `json:"url"`
	Approved int    `json:"approved"`
}

// sdkResult is a CallToolResult, by its wire names.
type sdkResult struct {
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	IsError           bool                       `json:"isError"`
	Meta              map[string]json.RawMessage `json:"_meta"`
	StructuredContent json.RawMessage            `json:"structuredContent"`
}

func (st sdkStep) result(t *testing.T) sdkResult {
	t.Helper()
	var r sdkResult
	if err := json.Unmarshal(st.Raw, &r); err != nil {
		t.Fatalf("%s: result %s: %v", st.Step, st.Raw, err)
	}
	return r
}

func (r sdkResult) text() string {
	var parts []string
	for _, c := range r.Content {
		parts = append(parts, c.Text)
	}
	return strings.Join(parts, "\n")
}

// summary is one line of the matrix: what the caller saw, and on the wire.
func (st sdkStep) summary() string {
	var b strings.Builder
	switch {
	case st.Error != nil:
		b.WriteString("error " + st.Error.String())
	case st.Op == "call":
		fmt.Fprintf(&b, "result %s", st.Raw)
	case st.Op == "list":
		fmt.Fprintf(&b, "tools %v", st.Tools)
	case st.Op == "connect":
		fmt.Fprintf(&b, "connected at %s", st.ProtocolVersion)
	default:
		b.WriteString("ok")
	}
	if len(st.Stream) > 0 {
		b.WriteString("; stream yielded")
		for _, m := range st.Stream {
			b.WriteString(" " + string(m))
		}
	}
	fmt.Fprintf(&b, "; onerror fired %t %q; http", st.OnerrorFired, st.Onerror)
	for _, h := range st.HTTP {
		fmt.Fprintf(&b, " [%s %s %d %s]", h.HTTPMethod, h.Method, h.Status, h.ContentType)
	}
	return b.String()
}

// sdkClient is one agent's session on one SDK.
type sdkClient interface {
	do(t *testing.T, r sdkReq) sdkStep
}

// sdkKind is an SDK client under test.
type sdkKind struct {
	name string
	// stream: the SDK has TypeScript's experimental callToolStream.
	stream bool
	start  func(t *testing.T, kind sdkKind) sdkClient
	// api is the Python client's connect API ("session" or "client").
	api string
	// version is the protocol version the Go client asks for ("" for
	// its default).
	version string
}

// sdkKinds are the SDKs under test: the Go SDK at its default (which
// probes 2026-07-28's server/discover first) and at 2025-11-25; the
// TypeScript Client (2025-11-25); the Python ClientSession (2025-11-25) and
// mcp.Client (its default mode auto: 2026-07-28, else initialize). Without
// the installed clients it fails the test.
func sdkKinds(t *testing.T) []sdkKind {
	t.Helper()
	node, python := os.Getenv("CAPSNAP_E2E_NODE"), os.Getenv("CAPSNAP_E2E_PYTHON")
	const how = "run `make e2e`, which installs the TypeScript and Python MCP SDK clients (bash e2e/clients/install.sh) and sets CAPSNAP_E2E_NODE and CAPSNAP_E2E_PYTHON; by hand: bash e2e/clients/install.sh && CAPSNAP_E2E_NODE=$(which node) CAPSNAP_E2E_PYTHON=$PWD/bin/sdk-venv/bin/python go test -tags e2e ./e2e/"
	if node == "" || python == "" {
		t.Fatalf("CAPSNAP_E2E_NODE=%q, CAPSNAP_E2E_PYTHON=%q: both must name an interpreter; %s", node, python, how)
	}
	for _, bin := range []string{node, python} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%v; %s", err, how)
		}
	}
	ts, err := filepath.Abs("clients/ts/client.mjs")
	if err != nil {
		t.Fatal(err)
	}
	py, err := filepath.Abs("clients/python/client.py")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(ts), "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		t.Fatalf("the TypeScript MCP SDK is not installed in %s (%v); %s", filepath.Dir(ts), err, how)
	}
	proc := func(bin, script string) func(*testing.T, sdkKind) sdkClient {
		return func(t *testing.T, kind sdkKind) sdkClient { return sdkStartProc(t, kind.name, bin, script) }
	}
	goClient := func(_ *testing.T, kind sdkKind) sdkClient { return &sdkGoClient{version: kind.version} }
	return []sdkKind{
		{name: "go", start: goClient},
		{name: "go-2025-11-25", start: goClient, version: "2025-11-25"},
		{name: "typescript", start: proc(node, ts), stream: true},
		{name: "python", start: proc(python, py), api: "session"},
		{name: "python-client", start: proc(python, py), api: "client"},
	}
}

// sdkAgent is one scripted agent: an SDK client, and how many steps it ran
// (each step's id).
type sdkAgent struct {
	kind sdkKind
	c    sdkClient
	n    int
}

// sdkConnect starts kind's client and connects it to url as principal
// (none if empty); it returns the connect step, which may have failed.
func sdkConnect(t *testing.T, kind sdkKind, url, principal string) (*sdkAgent, sdkStep) {
	t.Helper()
	return sdkConnectWith(t, kind, sdkReq{URL: url}, principal)
}

// sdkConnectWith is sdkConnect with req's other fields (ElicitationURL).
func sdkConnectWith(t *testing.T, kind sdkKind, req sdkReq, principal string) (*sdkAgent, sdkStep) {
	t.Helper()
	a := &sdkAgent{kind: kind, c: kind.start(t, kind)}
	h := map[string]string{}
	if principal != "" {
		h[testbed.PrincipalHeader] = principal
	}
	req.Op, req.Headers, req.API = "connect", h, kind.api
	st := a.do(t, req)
	if st.Error == nil {
		sdkCheckVersion(t, kind, st)
	}
	return a, st
}

// sdkMustConnect is sdkConnect that fails the test if the connect failed.
func sdkMustConnect(t *testing.T, kind sdkKind, url, principal string) *sdkAgent {
	t.Helper()
	a, st := sdkConnect(t, kind, url, principal)
	if !st.OK {
		t.Fatalf("[%s] connect as %q: %s", kind.name, principal, st.summary())
	}
	return a
}

// sdkCheckVersion fails unless the client runs the pinned SDK.
func sdkCheckVersion(t *testing.T, kind sdkKind, st sdkStep) {
	t.Helper()
	var v struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	}
	if err := json.Unmarshal(st.SDK, &v); err != nil {
		t.Fatalf("[%s] connect reported sdk %s: %v", kind.name, st.SDK, err)
	}
	want := map[string]string{"@modelcontextprotocol/sdk": sdkTSVersion, "mcp": sdkPythonVersion}[v.Name]
	if want != "" && v.Version != want {
		t.Fatalf("[%s] the client runs %s %s, want the pinned %s: run bash e2e/clients/install.sh", kind.name, v.Name, v.Version, want)
	}
}

func (a *sdkAgent) do(t *testing.T, r sdkReq) sdkStep {
	t.Helper()
	a.n++
	if r.ID == "" {
		r.ID = fmt.Sprintf("%d-%s", a.n, r.Op)
		if r.Name != "" {
			r.ID += "-" + r.Name
		}
	}
	if r.TimeoutMS == 0 {
		r.TimeoutMS = int(sdkStepTimeout / time.Millisecond)
	}
	st := a.c.do(t, r)
	t.Logf("[%s] %s: %s", a.kind.name, r.ID, st.summary())
	return st
}

func (a *sdkAgent) list(t *testing.T) []string {
	t.Helper()
	st := a.do(t, sdkReq{Op: "list"})
	if !st.OK {
		t.Fatalf("[%s] tools/list: %s", a.kind.name, st.summary())
	}
	return st.Tools
}

func (a *sdkAgent) call(t *testing.T, tool string, args map[string]any) sdkStep {
	t.Helper()
	return a.do(t, sdkReq{Op: "call", Name: tool, Arguments: args})
}

// mustAllow calls tool and fails unless the call returned the tool's own
// result; it returns the result's text.
func (a *sdkAgent) mustAllow(t *testing.T, tool string, args map[string]any) string {
	t.Helper()
	st := a.call(t, tool, args)
	if !st.OK {
		t.Fatalf("[%s] %s: %s, want it allowed", a.kind.name, tool, st.summary())
	}
	r := st.result(t)
	if r.IsError {
		t.Fatalf("[%s] %s: a tool error: %s", a.kind.name, tool, st.Raw)
	}
	a.noOnerror(t, st)
	return r.text()
}

// noOnerror fails if the SDK reported anything out of band during st:
// TypeScript's Client.onerror or transport onerror, a Python warning log.
func (a *sdkAgent) noOnerror(t *testing.T, st sdkStep) {
	t.Helper()
	if st.OnerrorFired {
		t.Fatalf("[%s] %s: the SDK reported an error out of band: %q", a.kind.name, st.Step, st.Onerror)
	}
}

// sdkDenial is capsnap's error data, as a caller reads it.
type sdkDenial struct {
	Reason       string   `json:"reason"`
	Drift        bool     `json:"capability_drift"`
	ReturnTo     string   `json:"return_to"`
	Detail       string   `json:"detail"`
	Tool         string   `json:"tool"`
	AllowedTools []string `json:"allowed_tools"`
	// Epoch is the snapshot the call was decided under, if any.
	Epoch string `json:"epoch"`
	// Limit is a budget's or rate limit's, on budget_exhausted and
	// rate_limited (sdkLimit).
	Limit json.RawMessage `json:"limit"`
	// Approval is where a person approves the call, on approval_required.
	Approval *struct {
		ID  string `json:"id"`
		URL string `json:"url"`
	} `json:"approval"`
	// Review is where a person reviews a changed tool, on
	// tool_under_review.
	Review *struct {
		ID  string `json:"id"`
		URL string `json:"url"`
	} `json:"review"`
	// Change is what changed, on schema_drift.
	Change *struct {
		Kinds  []string `json:"kinds"`
		Fields []string `json:"fields"`
	} `json:"change"`
}

// denialOf fails unless st failed with the SDK's MCP error carrying
// capsnap's code and data, and returns the data.
func (a *sdkAgent) denialOf(t *testing.T, st sdkStep) sdkDenial {
	t.Helper()
	e := st.Error.mcpErr()
	if st.OK || e == nil {
		t.Fatalf("[%s] %s: %s, want an MCP error with code -31000", a.kind.name, st.Step, st.summary())
	}
	if want := map[string]string{"typescript": "McpError", "python": "mcp.shared.exceptions.MCPError", "python-client": "mcp.shared.exceptions.MCPError"}[a.kind.name]; want != "" && e.Class != want {
		t.Fatalf("[%s] %s: %s, want the SDK's %s", a.kind.name, st.Step, st.Error, want)
	}
	if strings.HasPrefix(a.kind.name, "go") && e.Class != "*jsonrpc.Error" {
		t.Fatalf("[%s] %s: %s, want a *jsonrpc.Error", a.kind.name, st.Step, st.Error)
	}
	if *e.Code != -31000 {
		t.Fatalf("[%s] %s: %s, want capsnap's code -31000", a.kind.name, st.Step, st.Error)
	}
	var d sdkDenial
	if err := json.Unmarshal(e.Data, &d); err != nil || d.Reason == "" {
		t.Fatalf("[%s] %s: error data %s is not capsnap's (%v)", a.kind.name, st.Step, e.Data, err)
	}
	return d
}

// mustDeny calls tool and fails unless capsnap denied it with reason and
// the SDK surfaced the denial as its MCP error, out of band nothing.
func (a *sdkAgent) mustDeny(t *testing.T, tool string, args map[string]any, reason string) sdkDenial {
	t.Helper()
	st := a.call(t, tool, args)
	d := a.denialOf(t, st)
	if d.Reason != reason {
		t.Fatalf("[%s] %s: reason %q, want %s: %s", a.kind.name, tool, d.Reason, reason, st.summary())
	}
	a.noOnerror(t, st)
	sdkCheckWire(t, a.kind, st, "tools/call", http.StatusOK)
	return d
}

// sdkCheckWire fails unless the client's last request of method was
// answered with status and application/json: the form the denial took.
func sdkCheckWire(t *testing.T, kind sdkKind, st sdkStep, method string, status int) {
	t.Helper()
	for i := len(st.HTTP) - 1; i >= 0; i-- {
		if h := st.HTTP[i]; h.Method == method {
			if h.Status != status || !strings.HasPrefix(h.ContentType, "application/json") {
				t.Fatalf("[%s] %s: %s was answered %d %q, want %d application/json", kind.name, st.Step, method, h.Status, h.ContentType, status)
			}
			return
		}
	}
	t.Fatalf("[%s] %s: the client sent no %s: %s", kind.name, st.Step, method, st.summary())
}

// toolResultDenial fails unless st is a tool result that denies the call
// (denials.call_form: tool_result), and returns its _meta data.
func (a *sdkAgent) toolResultDenial(t *testing.T, st sdkStep, reason string) sdkDenial {
	t.Helper()
	if !st.OK {
		t.Fatalf("[%s] %s: %s, want a tool result", a.kind.name, st.Step, st.summary())
	}
	r := st.result(t)
	var d sdkDenial
	if err := json.Unmarshal(r.Meta[sdkMetaDenial], &d); err != nil {
		t.Fatalf("[%s] %s: result %s has no _meta[%q] (%v)", a.kind.name, st.Step, st.Raw, sdkMetaDenial, err)
	}
	if !r.IsError || d.Reason != reason || !strings.Contains(r.text(), reason) {
		t.Fatalf("[%s] %s: result %s, want isError, _meta[%q].reason %s and the reason in its text", a.kind.name, st.Step, st.Raw, sdkMetaDenial, reason)
	}
	if len(r.StructuredContent) > 0 {
		t.Fatalf("[%s] %s: a denial with structuredContent %s, which a client holds to the tool's outputSchema", a.kind.name, st.Step, r.StructuredContent)
	}
	a.noOnerror(t, st)
	return d
}

// sdkConnectDenied fails unless a connect without a principal failed with
// the SDK's MCP error carrying capsnap's no_principal.
func sdkConnectDenied(t *testing.T, kind sdkKind, url string) sdkStep {
	t.Helper()
	a, st := sdkConnect(t, kind, url, "")
	if st.OK {
		t.Fatalf("[%s] connect without a principal succeeded: %s", kind.name, st.summary())
	}
	if d := a.denialOf(t, st); d.Reason != "no_principal" {
		t.Fatalf("[%s] connect without a principal: reason %q, want no_principal", kind.name, d.Reason)
	}
	return st
}

// sdkSeedStack runs the billing stack under the seed's policy (a USD 250
// cap, a reason allowlist, refund only after lookup_order) with capsnap's
// denials section set to denials, a YAML flow mapping ("" leaves the
// defaults).
func sdkSeedStack(t *testing.T, denials string) *testbed.Stack {
	t.Helper()
	seed, err := os.ReadFile("../examples/demo/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return startStackWith(t, func(o *testbed.StackOptions) { o.Policy, o.Denials = seed, denials })
}

// What the seed's worked example sends.
var (
	sdkRefund40  = refundOf(40, "duplicate_charge")
	sdkRefund400 = refundOf(400, "duplicate_charge")
)

// Under capsnap's default denials (HTTP 200, a JSON-RPC error for the
// request's id), every SDK's caller gets its SDK's own MCP error, with
// capsnap's code and data, for every kind of denial; nothing fires out of
// band; and the session goes on working.
func TestSDKDenials(t *testing.T) {
	kinds := sdkKinds(t)
	s := sdkSeedStack(t, "")
	url := s.MCPURL()
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Run("allowed", func(t *testing.T) {
				redeploy(t, s, "billing", billing.Baseline)
				a := sdkMustConnect(t, kind, url, supportAgent)
				if got := a.list(t); !slices.Equal(sdkSorted(got), []string{"lookup_order", "refund"}) {
					t.Fatalf("[%s] delivered %v, want lookup_order and refund", kind.name, got)
				}
				a.mustAllow(t, "lookup_order", lookupA100)
				before := starts(t, s, "billing", "refund")
				if text := a.mustAllow(t, "refund", sdkRefund40); !strings.Contains(text, "Refund rf_") {
					t.Fatalf("[%s] refund answered %q, want the refund's own text", kind.name, text)
				}
				if got := starts(t, s, "billing", "refund") - before; got != 1 {
					t.Fatalf("[%s] refund's handler ran %d times, want once", kind.name, got)
				}
				if kind.stream {
					st := a.do(t, sdkReq{Op: "stream", Name: "lookup_order", Arguments: lookupA100})
					if !st.OK || st.result(t).IsError {
						t.Fatalf("[%s] callToolStream of an allowed call: %s", kind.name, st.summary())
					}
				}
			})

			t.Run("schema_drift", func(t *testing.T) {
				redeploy(t, s, "billing", billing.Baseline)
				a := sdkMustConnect(t, kind, url, supportAgent)
				a.list(t)
				a.mustAllow(t, "lookup_order", lookupA100)
				redeploy(t, s, "billing", billing.SkipFraudCheck)
				before := starts(t, s, "billing", "refund")
				d := a.mustDeny(t, "refund", sdkRefund40, "schema_drift")
				if d.ReturnTo != "planning" || !d.Drift || d.Tool != "refund" {
					t.Fatalf("[%s] drift data %+v, want return_to planning, capability_drift, tool refund", kind.name, d)
				}
				if starts(t, s, "billing", "refund") != before {
					t.Fatalf("[%s] a drift-denied refund started its handler", kind.name)
				}
				if kind.stream {
					a.mustStreamDeny(t, "refund", sdkRefund40, "schema_drift")
				}
				// The same session: a tool that did not change is still
				// callable under the old snapshot, and after the planner
				// lists again, so is the changed one.
				a.mustAllow(t, "lookup_order", lookupA100)
				a.list(t)
				a.mustAllow(t, "lookup_order", lookupA100)
				a.mustAllow(t, "refund", sdkRefund40)
				if got := starts(t, s, "billing", "refund") - before; got != 1 {
					t.Fatalf("[%s] refund's handler ran %d times after the drift, want once", kind.name, got)
				}
			})

			t.Run("tool_not_granted", func(t *testing.T) {
				redeploy(t, s, "billing", billing.Baseline)
				a := sdkMustConnect(t, kind, url, readonlyAgent)
				if got := a.list(t); !slices.Equal(got, []string{"lookup_order"}) {
					t.Fatalf("[%s] delivered %v to the read-only agent, want only lookup_order", kind.name, got)
				}
				before := starts(t, s, "billing", "refund")
				d := a.mustDeny(t, "refund", sdkRefund40, "tool_not_granted")
				if !slices.Equal(d.AllowedTools, []string{"lookup_order"}) {
					t.Fatalf("[%s] allowed_tools %v, want [lookup_order]", kind.name, d.AllowedTools)
				}
				if kind.stream {
					a.mustStreamDeny(t, "refund", sdkRefund40, "tool_not_granted")
				}
				if starts(t, s, "billing", "refund") != before {
					t.Fatalf("[%s] a refund not granted started its handler", kind.name)
				}
				a.mustAllow(t, "lookup_order", lookupA100)
			})

			t.Run("constraint_violation", func(t *testing.T) {
				redeploy(t, s, "billing", billing.Baseline)
				a := sdkMustConnect(t, kind, url, supportAgent)
				a.list(t)
				a.mustAllow(t, "lookup_order", lookupA100)
				before := starts(t, s, "billing", "refund")
				d := a.mustDeny(t, "refund", sdkRefund400, "constraint_violation")
				if d.ReturnTo != "planning" || !strings.Contains(d.Detail, "usd_cap_250") {
					t.Fatalf("[%s] constraint data %+v, want return_to planning and usd_cap_250 named in detail", kind.name, d)
				}
				if starts(t, s, "billing", "refund") != before {
					t.Fatalf("[%s] a refund over the cap started its handler", kind.name)
				}
				a.mustAllow(t, "refund", sdkRefund40)
			})

			// Not a tools/call: the connect itself (initialize, or
			// 2026-07-28's server/discover) of an agent with no principal.
			t.Run("no_principal", func(t *testing.T) {
				sdkConnectDenied(t, kind, url)
			})

			// A principal the policy has no rule for is not denied its
			// connect or its list: it is delivered nothing.
			t.Run("no_rule", func(t *testing.T) {
				a := sdkMustConnect(t, kind, url, sdkNobody)
				if got := a.list(t); len(got) != 0 {
					t.Fatalf("[%s] delivered %v to a principal with no rule, want nothing", kind.name, got)
				}
			})
		})
	}
}

// sdkNobody is a principal the seed's policy has no rule for.
const sdkNobody = "spiffe://acme/agent/nobody"

// mustStreamDeny runs TypeScript's client.experimental.tasks.callToolStream
// and fails unless it yielded one error message: the SDK's McpError with
// capsnap's code and data.
func (a *sdkAgent) mustStreamDeny(t *testing.T, tool string, args map[string]any, reason string) {
	t.Helper()
	st := a.do(t, sdkReq{Op: "stream", Name: tool, Arguments: args})
	if len(st.Stream) != 1 {
		t.Fatalf("[%s] callToolStream yielded %d messages, want one error: %s", a.kind.name, len(st.Stream), st.summary())
	}
	if d := a.denialOf(t, st); d.Reason != reason {
		t.Fatalf("[%s] callToolStream: reason %q, want %s", a.kind.name, d.Reason, reason)
	}
	a.noOnerror(t, st)
}

func sdkSorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// With denials.status http_error, a denial is the HTTP error it was
// before (403 here): Go's and Python's clients still read its JSON-RPC
// body, TypeScript's throws a StreamableHTTPError with the status and the
// body only as text, and fires onerror. Every session survives.
func TestSDKDenialsHTTPError(t *testing.T) {
	kinds := sdkKinds(t)
	s := sdkSeedStack(t, "{status: http_error}")
	url := s.MCPURL()
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Run("tool_not_granted", func(t *testing.T) {
				a := sdkMustConnect(t, kind, url, readonlyAgent)
				a.list(t)
				st := a.call(t, "refund", sdkRefund40)
				sdkCheckWire(t, kind, st, "tools/call", http.StatusForbidden)
				if kind.name == "typescript" {
					sdkCheckTSHTTPError(t, st, "tool_not_granted")
				} else if d := a.denialOf(t, st); d.Reason != "tool_not_granted" {
					t.Fatalf("[%s] reason %q, want tool_not_granted", kind.name, d.Reason)
				}
				if kind.stream {
					// What the planner gets from callToolStream: logged,
					// not held to a form.
					if st := a.do(t, sdkReq{Op: "stream", Name: "refund", Arguments: sdkRefund40}); st.OK {
						t.Fatalf("[%s] callToolStream of a denied call succeeded: %s", kind.name, st.summary())
					}
				}
				a.mustAllow(t, "lookup_order", lookupA100)
			})
			t.Run("no_principal", func(t *testing.T) {
				if kind.name != "typescript" {
					sdkConnectDenied(t, kind, url)
					return
				}
				_, st := sdkConnect(t, kind, url, "")
				sdkCheckTSHTTPError(t, st, "no_principal")
			})
		})
	}
}

// sdkCheckTSHTTPError fails unless st is TypeScript's StreamableHTTPError
// for a 403 whose text carries capsnap's JSON-RPC error with reason, and
// the SDK also reported it through onerror (as if the transport failed).
func sdkCheckTSHTTPError(t *testing.T, st sdkStep, reason string) {
	t.Helper()
	e := st.Error
	if st.OK || e == nil || e.Class != "StreamableHTTPError" || e.Code == nil || *e.Code != http.StatusForbidden {
		t.Fatalf("[typescript] %s: %s, want a StreamableHTTPError with code 403", st.Step, st.summary())
	}
	if len(e.Data) > 0 {
		t.Fatalf("[typescript] %s: a StreamableHTTPError with data %s: the SDK now reads the body", st.Step, e.Data)
	}
	var body struct {
		Code int       `json:"code"`
		Data sdkDenial `json:"data"`
	}
	if err := json.Unmarshal(e.BodyError, &body); err != nil || body.Code != -31000 || body.Data.Reason != reason {
		t.Fatalf("[typescript] %s: the message %q does not end in capsnap's JSON-RPC error with reason %s (%v)", st.Step, e.Message, reason, err)
	}
	if !st.OnerrorFired {
		t.Fatalf("[typescript] %s: a non-2xx answer did not fire onerror", st.Step)
	}
}

// With denials.call_form tool_result, a denied tools/call is a tool result
// with isError in every SDK, the reason in its text and capsnap's data in
// _meta; a denial of anything else (here the connect) is still the JSON-RPC
// error.
func TestSDKDenialsToolResult(t *testing.T) {
	kinds := sdkKinds(t)
	s := sdkSeedStack(t, "{status: ok, call_form: tool_result}")
	url := s.MCPURL()
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Run("tool_not_granted", func(t *testing.T) {
				a := sdkMustConnect(t, kind, url, readonlyAgent)
				a.list(t)
				before := starts(t, s, "billing", "refund")
				d := a.toolResultDenial(t, a.call(t, "refund", sdkRefund40), "tool_not_granted")
				if !slices.Equal(d.AllowedTools, []string{"lookup_order"}) || d.ReturnTo == "" {
					t.Fatalf("[%s] _meta denial %+v, want allowed_tools [lookup_order] and a return_to", kind.name, d)
				}
				if kind.stream {
					st := a.do(t, sdkReq{Op: "stream", Name: "refund", Arguments: sdkRefund40})
					a.toolResultDenial(t, st, "tool_not_granted")
				}
				if starts(t, s, "billing", "refund") != before {
					t.Fatalf("[%s] a refund not granted started its handler", kind.name)
				}
				a.mustAllow(t, "lookup_order", lookupA100)
			})
			t.Run("constraint_violation", func(t *testing.T) {
				a := sdkMustConnect(t, kind, url, supportAgent)
				a.list(t)
				a.mustAllow(t, "lookup_order", lookupA100)
				d := a.toolResultDenial(t, a.call(t, "refund", sdkRefund400), "constraint_violation")
				if d.ReturnTo != "planning" {
					t.Fatalf("[%s] _meta denial %+v, want return_to planning", kind.name, d)
				}
				a.mustAllow(t, "refund", sdkRefund40)
			})
			t.Run("no_principal", func(t *testing.T) {
				sdkConnectDenied(t, kind, url)
			})
		})
	}
}

// A long-running call's progress notifications reach every SDK's caller
// while the call runs, through Envoy and capsnap, not with the result.
func TestSDKProgress(t *testing.T) {
	kinds := sdkKinds(t)
	s := deliveryStack(t, "", nil)
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			a := sdkMustConnect(t, kind, s.MCPURL(), deliveryAgent)
			a.list(t)
			st := a.do(t, sdkReq{Op: "call", Name: "slow_report", Arguments: map[string]any{}, Progress: true})
			if !st.OK || st.result(t).IsError {
				t.Fatalf("[%s] slow_report: %s", kind.name, st.summary())
			}
			a.noOnerror(t, st)
			if len(st.Progress) != 5 {
				t.Fatalf("[%s] %d progress notifications reached the caller, want 5", kind.name, len(st.Progress))
			}
			for i, p := range st.Progress {
				if p.Progress != float64(i+1) || p.Total != 5 {
					t.Fatalf("[%s] progress %d is %v/%v, want %d/5", kind.name, i, p.Progress, p.Total, i+1)
				}
			}
			first, last := st.Progress[0].T, st.Progress[len(st.Progress)-1].T
			t.Logf("[%s] progress at %.0f..%.0fms, result at %.0fms after the call", kind.name, first-st.StartedAt, last-st.StartedAt, st.FinishedAt-st.StartedAt)
			// The fixture sends them 150ms apart and answers 150ms after
			// the last: buffered, all would arrive with the result.
			if lead := st.FinishedAt - first; lead < 300 {
				t.Fatalf("[%s] the first progress reached the caller %.0fms before the result, want over 300ms", kind.name, lead)
			}
			if spread := last - first; spread < 300 {
				t.Fatalf("[%s] the progress notifications reached the caller within %.0fms, want them spread as sent", kind.name, spread)
			}
		})
	}
}

// --- The clients as subprocesses -------------------------------------------

// sdkProc is a client program (e2e/clients) speaking the steps protocol.
type sdkProc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan []byte
	stderr *sdkBuffer
}

type sdkBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *sdkBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *sdkBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func sdkStartProc(t *testing.T, name, bin, script string) *sdkProc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), sdkProcTimeout)
	p := &sdkProc{name: name, lines: make(chan []byte, 64), stderr: &sdkBuffer{}}
	p.cmd = exec.CommandContext(ctx, bin, script)
	p.cmd.Dir = filepath.Dir(script)
	p.cmd.Stderr = p.stderr
	p.cmd.WaitDelay = 5 * time.Second
	// Python's SDK reads proxies from the environment; loopback needs none.
	p.cmd.Env = append(os.Environ(), "NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost", "PYTHONUNBUFFERED=1")
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		cancel()
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start the %s client (%s %s): %v", name, bin, script, err)
	}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
		for sc.Scan() {
			p.lines <- bytes.Clone(sc.Bytes())
		}
	}()
	t.Cleanup(func() {
		// Closing stdin ends the client; it gets a moment to close its
		// session, then the context's end kills it.
		p.stdin.Close()
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			cancel()
			err = <-done
		}
		cancel()
		if t.Failed() || err != nil {
			t.Logf("--- the %s client's stderr (exit: %v) ---\n%s", name, err, p.stderr.String())
		}
	})
	return p
}

func (p *sdkProc) do(t *testing.T, r sdkReq) sdkStep {
	t.Helper()
	line, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.stdin.Write(append(line, '\n')); err != nil {
		t.Fatalf("[%s] send step %s: %v\nstderr:\n%s", p.name, r.ID, err, p.stderr.String())
	}
	timer := time.NewTimer(time.Duration(r.TimeoutMS)*time.Millisecond + sdkStepSlack)
	defer timer.Stop()
	var progress []sdkProgress
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				t.Fatalf("[%s] the client ended before it answered step %s\nstderr:\n%s", p.name, r.ID, p.stderr.String())
			}
			var ev struct {
				Event   string `json:"event"`
				Step    string `json:"step"`
				Message string `json:"message"`
				sdkProgress
			}
			if err := json.Unmarshal(line, &ev); err != nil {
				t.Fatalf("[%s] the client printed %q: %v", p.name, line, err)
			}
			switch ev.Event {
			case "progress":
				if ev.Step == r.ID {
					progress = append(progress, ev.sdkProgress)
				}
				continue
			case "fatal":
				t.Fatalf("[%s] the client failed: %s\nstderr:\n%s", p.name, ev.Message, p.stderr.String())
			case "":
			default:
				t.Fatalf("[%s] the client printed an unknown event %s", p.name, line)
			}
			var st sdkStep
			if err := json.Unmarshal(line, &st); err != nil {
				t.Fatalf("[%s] the client's answer %s: %v", p.name, line, err)
			}
			if st.Step != r.ID {
				t.Fatalf("[%s] answer to step %q while waiting for %q: %s", p.name, st.Step, r.ID, line)
			}
			st.Progress = progress
			return st
		case <-timer.C:
			t.Fatalf("[%s] no answer to step %s within %v\nstderr:\n%s", p.name, r.ID, time.Duration(r.TimeoutMS)*time.Millisecond+sdkStepSlack, p.stderr.String())
		}
	}
}

// --- The Go SDK, in process ------------------------------------------------

// sdkGoClient runs the steps on the official Go SDK, as the other tests'
// agents do, answering as the client programs would.
type sdkGoClient struct {
	version string
	// noStandaloneSSE opens no GET stream: the session meets the server
	// only on its own requests.
	noStandaloneSSE bool
	cs              *mcp.ClientSession
	rec             *sdkRecorder

	mu       sync.Mutex
	step     string
	progress []sdkProgress
	elicited []sdkElicited
}

// sdkRecorder sends a step's headers on every request and records what
// the transport sent and got.
type sdkRecorder struct {
	headers map[string]string
	mu      sync.Mutex
	log     []sdkHTTP
}

func (r *sdkRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range r.headers {
		req.Header.Set(k, v)
	}
	rec := sdkHTTP{HTTPMethod: req.Method}
	if req.Body != nil {
		body, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		var msg struct {
			Method string          `json:"method"`
			ID     json.RawMessage `json:"id"`
		}
		if json.Unmarshal(body, &msg) == nil {
			rec.Method = msg.Method
			if rec.Method == "" {
				rec.Method = "response"
			}
		}
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil {
		rec.Status, rec.ContentType = resp.StatusCode, resp.Header.Get("Content-Type")
	}
	r.mu.Lock()
	r.log = append(r.log, rec)
	r.mu.Unlock()
	return resp, err
}

func (r *sdkRecorder) take() []sdkHTTP {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.log
	r.log = nil
	return out
}

func sdkGoError(err error) *sdkError {
	var werr *jsonrpc.Error
	if errors.As(err, &werr) {
		code := int(werr.Code)
		return &sdkError{Class: "*jsonrpc.Error", Code: &code, Message: err.Error(), Data: werr.Data}
	}
	return &sdkError{Class: fmt.Sprintf("%T", err), Message: err.Error()}
}

func sdkGoVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "github.com/modelcontextprotocol/go-sdk" {
				return m.Version
			}
		}
	}
	return "unknown"
}

func (g *sdkGoClient) do(t *testing.T, r sdkReq) sdkStep {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.TimeoutMS)*time.Millisecond)
	defer cancel()
	g.mu.Lock()
	g.step, g.progress = r.ID, nil
	g.mu.Unlock()
	st := sdkStep{Step: r.ID, Op: r.Op, StartedAt: sdkNow()}
	var err error
	switch r.Op {
	case "reconnect":
		// What an agent does when its session is gone (the SDK does not
		// do it itself): close it, then connect anew.
		if g.cs != nil {
			if err := g.cs.Close(); err != nil {
				st.OnerrorFired, st.Onerror = true, append(st.Onerror, "close: "+err.Error())
			}
			g.cs = nil
		}
		fallthrough
	case "connect":
		st.SDK, _ = json.Marshal(map[string]string{"name": "github.com/modelcontextprotocol/go-sdk", "version": sdkGoVersion()})
		g.rec = &sdkRecorder{headers: r.Headers}
		opts := &mcp.ClientOptions{
			ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
				g.mu.Lock()
				defer g.mu.Unlock()
				if req.Params.ProgressToken == g.step {
					g.progress = append(g.progress, sdkProgress{T: sdkNow(), Progress: req.Params.Progress, Total: req.Params.Total})
				}
			},
		}
		if r.ElicitationURL {
			// The SDK infers form mode from a handler; URL mode is declared.
			opts.Capabilities = &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}}
			opts.ElicitationHandler = g.elicit(r.ElicitationApprove)
		}
		c := mcp.NewClient(&mcp.Implementation{Name: "capsnap-e2e-go", Version: "1"}, opts)
		transport := &mcp.StreamableClientTransport{Endpoint: r.URL, HTTPClient: &http.Client{Transport: g.rec}, DisableStandaloneSSE: g.noStandaloneSSE}
		var cs *mcp.ClientSession
		// The connection outlives ctx: Connect bounds only the handshake.
		cs, err = c.Connect(ctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: g.version})
		if err == nil {
			g.cs = cs
			t.Cleanup(func() { cs.Close() })
			st.ProtocolVersion, st.SessionID = cs.InitializeResult().ProtocolVersion, cs.ID()
		}
	case "list":
		var res *mcp.ListToolsResult
		if res, err = g.cs.ListTools(ctx, nil); err == nil {
			for _, tl := range res.Tools {
				st.Tools = append(st.Tools, tl.Name)
			}
		}
	case "call":
		g.mu.Lock()
		g.elicited = nil
		g.mu.Unlock()
		params := &mcp.CallToolParams{Name: r.Name, Arguments: r.Arguments}
		if r.Progress {
			params.SetProgressToken(r.ID)
		}
		var res *mcp.CallToolResult
		if res, err = g.cs.CallTool(ctx, params); err == nil {
			st.Raw, err = json.Marshal(res)
		}
	case "stream":
		err = errors.New("the Go SDK has no streaming tool-call API")
	case "close":
		if g.cs != nil {
			err = g.cs.Close()
		}
	default:
		err = fmt.Errorf("unknown op %q", r.Op)
	}
	st.FinishedAt = sdkNow()
	if err != nil {
		st.Error = sdkGoError(err)
	}
	st.OK = err == nil
	// A notification that came with the result may reach its handler
	// just after it.
	time.Sleep(20 * time.Millisecond)
	g.mu.Lock()
	st.Progress, st.Elicited = g.progress, g.elicited
	g.mu.Unlock()
	st.HTTP = g.rec.take()
	return st
}

// elicit is the Go agent's elicitation handler: it records what it was
// asked and, with an approver, plays the person (approves at the URL
// through the approval API) and accepts, as the Python agent does;
// without one it declines.
func (g *sdkGoClient) elicit(approver *sdkApprover) func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	return func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		seen := sdkElicited{Mode: req.Params.Mode, URL: req.Params.URL}
		action := "decline"
		if prefix := ""; approver != nil {
			prefix = approver.URL + "/approvals/"
			if id, ok := strings.CutPrefix(req.Params.URL, prefix); ok {
				if _, err := (&approval.Client{URL: approver.URL, Token: approver.Token}).Decide(ctx, id, true, "approved in the elicitation"); err == nil {
					seen.Approved, action = http.StatusOK, "accept"
				}
			}
		}
		g.mu.Lock()
		g.elicited = append(g.elicited, seen)
		g.mu.Unlock()
		return &mcp.ElicitResult{Action: action}, nil
	}
}

// sdkNow is the time as the client programs print it: ms since the epoch.
func sdkNow() float64 { return float64(time.Now().UnixNano()) / 1e6 }
