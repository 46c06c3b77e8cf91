//go:build e2e

package e2e

// MCP's session-expiry recovery through capsnap (issue 27): an upstream
// server on an official SDK restarts mid-session, so the session an agent
// holds is gone. The server's answer to the agent's next tools/list, an
// HTTP error with a JSON-RPC error that names no request (id null, or no
// id at all), must reach the agent as the server sent it, so that the
// agent's SDK raises the server's own error and the agent starts a new
// session: initialize again, list, and call a granted tool, all through the
// real Envoy and capsnap. capsnap must not put its own malformed_response
// in its place, and must not count or audit one.
//
// No SDK client starts the new session itself (read from their source):
// TypeScript's transport throws a StreamableHTTPError and keeps its
// session id; Python's streamable_http_client raises the server's JSON-RPC
// error when it can read one, else a stand-in of its own derived from the
// status, and keeps its session id too; the Go SDK reads neither server's
// error (it wants a valid id) and closes the connection, with
// ErrSessionMissing on a 404. So the agent here reconnects (the clients'
// "reconnect" op), as an agent must. How each SDK reports each server's
// answer is restartUpstream.want.
//
// The reference server answers a lost session 400, not 404 (see
// restartUpstreams); the Python SDK's server answers 404.
//
// Each case also runs the same SDK straight against the server, bypassing
// Envoy and capsnap: through capsnap the agent must see exactly what it
// sees there. In the new session the agent first calls without listing
// again (issue 39): its snapshot is its principal's, not the lost
// session's.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/testbed"
)

// restartUpstream is one server under test, run as the stack's two
// servers; only billing is restarted.
type restartUpstream struct {
	name  string
	stack func(t *testing.T) *testbed.Stack
	// principal is delivered exactly granted, and may call tool with
	// args, whose answer's text is text.
	principal string
	granted   []string
	tool      string
	args      map[string]any
	text      string
	// status, code and message are the server's own answer to a
	// request in a session it does not have; id tells whether that
	// JSON-RPC error has an id member (null).
	status  int
	code    int
	message string
	id      bool
}

// restartUpstreams are the reference server (the TypeScript SDK's
// StreamableHTTPServerTransport behind its own session map, see
// reference_test.go) and the Python SDK's example server (MCPServer, whose
// session manager answers 404; it checks capsnap's envelopes, see
// envelope_sdk_test.go).
func restartUpstreams(t *testing.T) []restartUpstream {
	t.Helper()
	var python verifierServer
	for _, srv := range verifierServers(t) {
		if srv.name == "python" {
			python = srv
		}
	}
	return []restartUpstream{
		{
			name:      "reference",
			stack:     refStack,
			principal: refAgent, granted: []string{"echo", "get-sum"},
			tool: "echo", args: refArgs["echo"], text: "Echo: through capsnap",
			// Not 404: server-everything looks the session up in its
			// own map before its transport does, and answers an unknown
			// one 400, with the request's id read from a body it never
			// parsed, so with no id member at all.
			status: http.StatusBadRequest, code: -32000, message: "Bad Request: No valid session ID provided",
		},
		{
			name:      "python",
			stack:     func(t *testing.T) *testbed.Stack { return verifierStack(t, python, false) },
			principal: supportAgent, granted: []string{"lookup_order", "refund"},
			tool: "lookup_order", args: lookupA100, text: "order A-100: paid, 40 USD",
			// mcp's StreamableHTTPSessionManager: INVALID_REQUEST.
			status: http.StatusNotFound, code: -32600, message: "Session not found", id: true,
		},
	}
}

// restartKinds are the SDK clients that hold a session with both servers:
// TypeScript's Client, Python's ClientSession, and the Go SDK at
// 2025-11-25 (at its default it may negotiate 2026-07-28, which has no
// sessions to lose) with no standalone GET stream: with one, the Go SDK
// most often learns of the loss there first (its reconnect is answered
// 404, and it fails the session with ErrSessionMissing before the agent's
// next request is sent), which is not the tools/list answer under test.
func restartKinds(t *testing.T) []sdkKind {
	t.Helper()
	var out []sdkKind
	for _, k := range sdkKinds(t) {
		if k.name == "typescript" || k.name == "python" {
			out = append(out, k)
		}
	}
	if len(out) != 2 {
		t.Fatalf("sdkKinds has %d of the TypeScript and Python clients", len(out))
	}
	goClient := func(*testing.T, sdkKind) sdkClient {
		return &sdkGoClient{version: "2025-11-25", noStandaloneSSE: true}
	}
	return append(out, sdkKind{name: "go", start: goClient, version: "2025-11-25"})
}

// restartWant is the error an SDK raises for the server's answer: its
// class, its code (none if nil), and text its message contains.
type restartWant struct {
	class string
	code  *int
	text  string
}

// want is what kind's SDK raises for u's answer to a request in a lost
// session, read from each SDK's source:
//
//   - TypeScript (client/streamableHttp.js send): any non-2xx is a
//     StreamableHTTPError whose code is the HTTP status and whose message
//     ends in the body as text; the caller finds the server's error there.
//   - Python (mcp/client/streamable_http.py _handle_post_request): the
//     server's JSON-RPC error, when the body is one; a JSON-RPC error
//     needs an id member (null will do), so without one the SDK raises
//     its own stand-in for the status: INTERNAL_ERROR "Server returned an
//     error response" (a 404 would be INVALID_REQUEST "Session
//     terminated").
//   - Go (mcp/streamable.go checkResponse): the server's JSON-RPC error
//     only if the body is a response with a valid id (jsonrpc2's
//     DecodeMessage refuses id null, and no id, as neither server's
//     has); else a 404 in a session is ErrSessionMissing ("session not
//     found", with the session's id) and any other status its text. The
//     connection is closed either way.
func (u restartUpstream) want(kind sdkKind) restartWant {
	code := func(c int) *int { return &c }
	switch {
	case kind.name == "typescript":
		return restartWant{"StreamableHTTPError", code(u.status), u.message}
	case kind.name == "python" && !u.id:
		return restartWant{"mcp.shared.exceptions.MCPError", code(-32603), "Server returned an error response"}
	case kind.name == "python":
		return restartWant{"mcp.shared.exceptions.MCPError", code(u.code), u.message}
	case u.status == http.StatusNotFound:
		return restartWant{"*fmt.wrapError", nil, mcp.ErrSessionMissing.Error()}
	default:
		return restartWant{"*fmt.wrapError", nil, http.StatusText(u.status)}
	}
}

// An upstream server restarts mid-session: through Envoy and capsnap, the
// agent's next tools/list gets the server's own error, with its status,
// byte for byte as the server sent it; the agent's SDK raises exactly what
// it raises straight from the server; the agent then initializes a new
// session, is delivered exactly its granted tools, and calls one.
func TestRestartSessionRecovery(t *testing.T) {
	kinds := restartKinds(t)
	for _, u := range restartUpstreams(t) {
		t.Run(u.name, func(t *testing.T) {
			s := u.stack(t)
			for _, kind := range kinds {
				t.Run(kind.name, func(t *testing.T) { testRestartRecovery(t, s, u, kind) })
			}
			restartNoMalformed(t, s)
		})
	}
}

func testRestartRecovery(t *testing.T, s *testbed.Stack, u restartUpstream, kind sdkKind) {
	url, directURL := s.RouteURL("billing"), s.ServerURL("billing")+"/mcp"
	a, st := sdkConnect(t, kind, url, u.principal)
	if !st.OK || st.SessionID == "" {
		t.Fatalf("[%s] connect: %s in session %q, want a session", kind.name, st.summary(), st.SessionID)
	}
	stale := st.SessionID
	version := st.ProtocolVersion
	if got := sdkSorted(a.list(t)); !slices.Equal(got, u.granted) {
		t.Fatalf("[%s] delivered %v, want exactly %v", kind.name, got, u.granted)
	}
	if text := a.mustAllow(t, u.tool, u.args); !strings.Contains(text, u.text) {
		t.Fatalf("[%s] %s answered %q, want %q", kind.name, u.tool, text, u.text)
	}
	// The same SDK straight to the server, to compare with.
	direct, dst := sdkConnect(t, kind, directURL, u.principal)
	if !dst.OK || dst.SessionID == "" {
		t.Fatalf("[%s] connect straight to the server: %s in session %q, want a session", kind.name, dst.summary(), dst.SessionID)
	}
	directStale := dst.SessionID
	direct.list(t)

	restartBilling(t, s)
	passed := faultMetric(t, s, "capsnap_deliveries_total", "result", "passed")

	// The agent's next tools/list, in the session it still holds, and
	// the same straight from the server. A subtest: whatever it finds,
	// the agent then recovers.
	t.Run("lost session", func(t *testing.T) {
		st := a.do(t, sdkReq{Op: "list"})
		dst := direct.do(t, sdkReq{Op: "list"})
		if st.OK || dst.OK {
			t.Fatalf("[%s] tools/list in a lost session succeeded: through Envoy %s; straight %s", kind.name, st.summary(), dst.summary())
		}
		restartCheckStatus(t, kind, dst, u.status)
		restartCheckError(t, kind, dst, u)
		restartCheckStatus(t, kind, st, u.status)
		restartCheckError(t, kind, st, u)
		if !restartSameError(st.Error, dst.Error, stale, directStale) {
			t.Fatalf("[%s] the SDK raised %s through Envoy, %s straight from the server", kind.name, st.Error, dst.Error)
		}
	})

	// What the server itself answers to a request in the lost session,
	// and what the agent gets through Envoy for the same request.
	t.Run("answer", func(t *testing.T) {
		own := restartProbe(t, directURL, stale, version, "")
		var body struct {
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		var members map[string]json.RawMessage
		if err := errors.Join(json.Unmarshal(own.body, &body), json.Unmarshal(own.body, &members)); err != nil || own.status != u.status || body.Error.Code != u.code || body.Error.Message != u.message {
			t.Fatalf("the restarted server answers a lost session %d %s (%v), want %d with error %d %q", own.status, own.body, err, u.status, u.code, u.message)
		}
		if _, ok := members["id"]; ok != u.id {
			t.Fatalf("the restarted server answers a lost session %s: an id member %t, want %t", own.body, ok, u.id)
		}
		got := restartProbe(t, url, stale, version, u.principal)
		if got.status != own.status || got.contentType != own.contentType || !bytes.Equal(got.body, own.body) || got.reason != "" {
			t.Fatalf("through Envoy a lost session is answered %d %q %s (x-capsnap-reason %q); the server itself answers %d %q %s",
				got.status, got.contentType, got.body, got.reason, own.status, own.contentType, own.body)
		}
	})

	// Two tools/list answers passed through capsnap as the server sent
	// them: the agent's and the probe's.
	if n := faultMetric(t, s, "capsnap_deliveries_total", "result", "passed") - passed; n != 2 {
		t.Errorf("capsnap_deliveries_total{result=passed} rose by %v for the lost session's two answers, want 2", n)
	}

	// A new session, on a new initialize.
	st = a.do(t, sdkReq{Op: "reconnect", URL: url, Headers: map[string]string{testbed.PrincipalHeader: u.principal}, API: kind.api})
	if !st.OK || st.SessionID == "" || st.SessionID == stale {
		t.Fatalf("[%s] reconnect: %s in session %q, want a new session", kind.name, st.summary(), st.SessionID)
	}
	sdkCheckVersion(t, kind, st)
	// Without listing again: the snapshot is the principal's, so the
	// list it was delivered in the lost session still holds its calls.
	if text := a.mustAllow(t, u.tool, u.args); !strings.Contains(text, u.text) {
		t.Fatalf("[%s] %s answered %q in the new session before listing, want %q", kind.name, u.tool, text, u.text)
	}
	if got := sdkSorted(a.list(t)); !slices.Equal(got, u.granted) {
		t.Fatalf("[%s] delivered %v in the new session, want exactly %v", kind.name, got, u.granted)
	}
	if text := a.mustAllow(t, u.tool, u.args); !strings.Contains(text, u.text) {
		t.Fatalf("[%s] %s answered %q in the new session, want %q", kind.name, u.tool, text, u.text)
	}
}

// restartBilling stops the billing server, waits until capsnap's view of
// it fails, starts a fresh process on the same address (with no sessions),
// and waits until capsnap has listed it again: only then does the agent's
// tools/list pass capsnap's Check to reach the server.
func restartBilling(t *testing.T, s *testbed.Stack) {
	t.Helper()
	t0 := time.Now()
	if err := s.Billing.Stop(); err != nil {
		t.Fatalf("stop billing: %v", err)
	}
	ctx := faultCtx(t)
	if err := s.WaitCatalogError(ctx, "billing"); err != nil {
		t.Fatal(err)
	}
	down := time.Since(t0)
	if err := s.RestartServer(ctx, "billing", ""); err != nil {
		t.Fatal(err)
	}
	faultCatalogView(t, s, "billing", "live again", func(v testbed.CatalogServer) bool { return v.LastError == "" && len(v.Tools) > 0 })
	t.Logf("billing restarted: capsnap saw it down after %v, live again %v after the stop", down.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
}

// restartAnswer is an HTTP answer to restartProbe.
type restartAnswer struct {
	status      int
	contentType string
	body        []byte
	reason      string
}

// restartProbe posts a tools/list in session to url (as principal, through
// Envoy, if set), as the SDK clients do, and returns the answer.
func restartProbe(t *testing.T, url, session, version, principal string) restartAnswer {
	t.Helper()
	resp, body := postTo(t, url, principal, `{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{}}`,
		map[string]string{"Mcp-Session-Id": session, "Mcp-Protocol-Version": version})
	return restartAnswer{resp.StatusCode, resp.Header.Get("Content-Type"), body, resp.Header.Get("x-capsnap-reason")}
}

// restartCheckStatus fails unless the client's tools/list in st was
// answered status.
func restartCheckStatus(t *testing.T, kind sdkKind, st sdkStep, status int) {
	t.Helper()
	for i := len(st.HTTP) - 1; i >= 0; i-- {
		if h := st.HTTP[i]; h.Method == "tools/list" {
			if h.Status != status {
				t.Fatalf("[%s] %s: tools/list was answered %d %q, want the server's %d: %s", kind.name, st.Step, h.Status, h.ContentType, status, st.summary())
			}
			return
		}
	}
	t.Fatalf("[%s] %s: the client sent no tools/list: %s", kind.name, st.Step, st.summary())
}

// restartCheckError fails unless st's error is what kind's SDK raises for
// u's answer, and carries nothing of capsnap's.
func restartCheckError(t *testing.T, kind sdkKind, st sdkStep, u restartUpstream) {
	t.Helper()
	want, e := u.want(kind), st.Error
	if m := e.mcpErr(); m != nil {
		e = m
	}
	if e == nil || e.Class != want.class || (e.Code == nil) != (want.code == nil) || want.code != nil && *e.Code != *want.code || !strings.Contains(e.Message, want.text) {
		code := "no code"
		if want.code != nil {
			code = fmt.Sprintf("code %d", *want.code)
		}
		t.Fatalf("[%s] %s: %s, want %s (%s) with %q", kind.name, st.Step, st.Error, want.class, code, want.text)
	}
	var data struct {
		Reason string `json:"reason"`
	}
	if len(e.Data) > 0 && json.Unmarshal(e.Data, &data) == nil && data.Reason != "" {
		t.Fatalf("[%s] %s: %s carries capsnap's reason %q", kind.name, st.Step, st.Error, data.Reason)
	}
	// TypeScript's StreamableHTTPError carries the server's error only as
	// text at the end of its message: what its caller can read of it.
	if kind.name == "typescript" {
		var be struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(e.BodyError, &be); err != nil || be.Code != u.code || be.Message != u.message {
			t.Fatalf("[%s] %s: the message %q does not end in the server's error %d %q (%v)", kind.name, st.Step, e.Message, u.code, u.message, err)
		}
	}
}

// restartSameError reports whether two SDK errors, each in its own
// session (which a message may name), are the same as a caller reads them.
func restartSameError(a, b *sdkError, aSession, bSession string) bool {
	if a == nil || b == nil {
		return a == b
	}
	same := func(x, y *int) bool { return x == nil && y == nil || x != nil && y != nil && *x == *y }
	aMsg := strings.ReplaceAll(a.Message, aSession, "SESSION")
	bMsg := strings.ReplaceAll(b.Message, bSession, "SESSION")
	if a.Class != b.Class || !same(a.Code, b.Code) || aMsg != bMsg || !bytes.Equal(a.Data, b.Data) || !bytes.Equal(a.BodyError, b.BodyError) || len(a.Sub) != len(b.Sub) {
		return false
	}
	for i := range a.Sub {
		if !restartSameError(a.Sub[i], b.Sub[i], aSession, bSession) {
			return false
		}
	}
	return true
}

// restartNoMalformed fails if capsnap refused any tools/list answer as
// malformed_response: by its metric, or its audit.
func restartNoMalformed(t *testing.T, s *testbed.Stack) {
	t.Helper()
	if n := faultMetric(t, s, "capsnap_deliveries_total", "result", "malformed_response"); n != 0 {
		t.Errorf("capsnap_deliveries_total{result=malformed_response} is %v, want 0", n)
	}
	for _, line := range strings.Split(s.Capsnap.Output(), "\n") {
		var a refAudit
		if json.Unmarshal([]byte(line), &a) == nil && a.Log == "audit" && a.Reason == "malformed_response" {
			t.Errorf("capsnap audited a malformed_response: %s", line)
		}
	}
}
