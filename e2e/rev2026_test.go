//go:build e2e

package e2e

// MCP 2026-07-28 end to end, between a client and servers on the
// official SDKs, none of which anyone here wrote but for the test harness
// around them, through the real Envoy and capsnap. The client is the
// Python SDK's mcp.Client (mcp 2.3.0; e2e/clients/python/client.py, api
// "client"). The servers, each run as both of the stack's servers, are
// the Python SDK's MCPServer (verifiers/python/example/server.py, guarded
// by capsnap's envelope verifier) and the TypeScript SDK's McpServer on its
// split 2.x packages (@modelcontextprotocol/server 2.4.0,
// e2e/clients/ts/server2026.mjs), the TypeScript SDK's only release that
// speaks 2026-07-28: @modelcontextprotocol/sdk (1.32.2, the newest) and
// server-everything (2026.8.31, on that SDK) speak up to 2025-11-25.
// capsnap's own catalog session speaks 2026-07-28 to them too
// (servers[].protocol_version).
//
// What the revision asks of capsnap, and what an agent on it does, each
// seen by the SDK's caller: server/discover passes; a subscriptions/listen
// stream passes, its acknowledgement, its list_changed and its keep-alive
// comments as the server sends them; a list is delivered filtered to the
// grants and reused from the client's cache within its ttlMs; a granted
// call runs, an ungranted one is denied; a call to a tool the server
// changed since the list is denied as drift until the agent lists again;
// and a request whose headers disagree with its body, or that names a
// revision capsnap does not speak, gets MCP's own error (-32020, -32022),
// HTTP 400, for its id.
//
// The interpreters and packages are those of the other SDK tests
// (e2e/clients/install.sh); without them these tests fail, never skip.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/testbed"
)

// rev2026 is the revision under test.
const rev2026 = "2026-07-28"

// rev2026TSServer is the version of @modelcontextprotocol/server that
// e2e/clients/ts/package.json pins.
const rev2026TSServer = "2.4.0"

// rev2026ListTTL is the ttlMs the servers give their tools/list results:
// long enough that a list is reused from the client's cache throughout.
const rev2026ListTTL = 5 * time.Minute

// rev2026Server is a server on an official SDK that speaks 2026-07-28.
type rev2026Server struct {
	name string
	// envelope: the server runs no call without capsnap's envelope.
	envelope bool
	// command runs the server as server id on addr, its tools/list results
	// cacheable for rev2026ListTTL, checking envelopes against the JWKS at
	// jwks if it checks them.
	command func(id, addr, jwks string) (string, []string)
}

// rev2026Servers are the Python and TypeScript SDKs' servers; a missing
// interpreter or package fails the test.
func rev2026Servers(t *testing.T) []rev2026Server {
	t.Helper()
	ttl := []string{"--list-ttl-ms", fmt.Sprint(rev2026ListTTL.Milliseconds())}
	var servers []rev2026Server
	for _, srv := range verifierServers(t) {
		if srv.name == "python" {
			servers = append(servers, rev2026Server{"python", true, func(id, addr, jwks string) (string, []string) {
				bin, args := srv.command(id, addr, jwks, "")
				return bin, append(args, ttl...)
			}})
		}
	}
	script, err := filepath.Abs("clients/ts/server2026.mjs")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(script), "node_modules", "@modelcontextprotocol", "server", "package.json"))
	var pkg struct {
		Version string `json:"version"`
	}
	if err == nil {
		err = json.Unmarshal(b, &pkg)
	}
	if err != nil || pkg.Version != rev2026TSServer {
		t.Fatalf("@modelcontextprotocol/server is installed at %q (%v), want the pinned %s: run bash e2e/clients/install.sh", pkg.Version, err, rev2026TSServer)
	}
	node := os.Getenv("CAPSNAP_E2E_NODE") // checked by verifierServers
	return append(servers, rev2026Server{"typescript", false, func(_, addr, _ string) (string, []string) {
		return node, append([]string{script, "--addr", addr}, ttl...)
	}})
}

// rev2026Stack runs srv as both servers, with capsnap's catalog speaking
// 2026-07-28 to them and signing envelopes if the server checks them.
func rev2026Stack(t *testing.T, srv rev2026Server) *testbed.Stack {
	t.Helper()
	return startStackWith(t, func(o *testbed.StackOptions) {
		o.Envelope, o.ProtocolVersion = srv.envelope, rev2026
		jwks := fmt.Sprintf("http://127.0.0.1:%d/.well-known/jwks.json", o.Ports.Admin)
		o.ServerCommand = func(id, addr string) (string, []string, []string) {
			bin, args := srv.command(id, addr, jwks)
			return bin, args, nil
		}
	})
}

// rev2026Client is the Python SDK's mcp.Client, which speaks 2026-07-28 to
// a server that does.
func rev2026Client(t *testing.T) sdkKind {
	t.Helper()
	for _, kind := range sdkKinds(t) {
		if kind.name == "python-client" {
			return kind
		}
	}
	t.Fatal("no python-client among the SDK clients")
	return sdkKind{}
}

func TestRev2026Interop(t *testing.T) {
	kind := rev2026Client(t)
	for _, srv := range rev2026Servers(t) {
		t.Run(srv.name, func(t *testing.T) { rev2026Interop(t, rev2026Stack(t, srv), kind) })
	}
}

func rev2026Interop(t *testing.T, s *testbed.Stack, kind sdkKind) {
	url := s.MCPURL()

	// capsnap's own session to each server is a 2026-07-28 one: it
	// listed after its subscriptions/listen stream was acknowledged.
	connected := 0
	for _, line := range strings.Split(s.Capsnap.Output(), "\n") {
		if strings.Contains(line, `"message":"catalog connected"`) && strings.Contains(line, `"protocol_version":"2026-07-28"`) {
			connected++
		}
	}
	if connected != len(testbed.Servers) {
		t.Fatalf("capsnap's catalog connected %d times at 2026-07-28, want once to each server:\n%s", connected, s.Capsnap.Output())
	}

	a, st := sdkConnect(t, kind, url, supportAgent)
	if !st.OK || st.ProtocolVersion != rev2026 || st.SessionID != "" {
		t.Fatalf("connect: %s (protocol %q, session %q), want 2026-07-28 without a session", st.summary(), st.ProtocolVersion, st.SessionID)
	}
	rev2026Wire(t, st, "server/discover", http.StatusOK, "application/json")

	st = a.do(t, sdkReq{Op: "listen"})
	var honored struct {
		ToolsListChanged bool `json:"toolsListChanged"`
	}
	if !st.OK || json.Unmarshal(st.Honored, &honored) != nil || !honored.ToolsListChanged {
		t.Fatalf("listen: %s, honored %s; want toolsListChanged acknowledged", st.summary(), st.Honored)
	}
	rev2026Wire(t, st, "subscriptions/listen", http.StatusOK, "text/event-stream")

	if got := a.list(t); !slices.Equal(sdkSorted(got), []string{"lookup_order", "refund"}) {
		t.Fatalf("delivered %v, want lookup_order and refund", got)
	}
	before := starts(t, s, "billing", "refund")
	a.mustAllow(t, "refund", sdkRefund40)
	if got := starts(t, s, "billing", "refund") - before; got != 1 {
		t.Fatalf("refund's handler ran %d times, want once", got)
	}

	// Within its ttlMs the client lists from its cache, and its calls
	// are held to the snapshot of the list it reused.
	st = a.do(t, sdkReq{Op: "list"})
	if !st.OK || len(st.HTTP) != 0 {
		t.Fatalf("a second list within ttlMs: %s, want it served from the client's cache", st.summary())
	}
	a.mustAllow(t, "lookup_order", lookupA100)

	// The server changes refund: its list_changed reaches the agent on
	// the listen stream, through Envoy and capsnap.
	digest := refCatalog(t, s)["refund"]
	redeployTo(t, s, "billing", "skip_fraud_check")
	rev2026NextChange(t, a)
	changed := time.Now()
	rev2026WaitCatalog(t, s, "refund", digest)

	// Until it lists again, a call to the changed tool is drift.
	before = starts(t, s, "billing", "refund")
	d := a.mustDeny(t, "refund", sdkRefund40, "schema_drift")
	if !d.Drift || d.ReturnTo != "planning" {
		t.Fatalf("drift denial %+v, want capability_drift and return_to planning", d)
	}
	a.mustAllow(t, "lookup_order", lookupA100)
	st = a.do(t, sdkReq{Op: "list"})
	if !st.OK {
		t.Fatalf("list after list_changed: %s", st.summary())
	}
	rev2026Wire(t, st, "tools/list", http.StatusOK, "application/json")
	a.mustAllow(t, "refund", sdkRefund40)
	if got := starts(t, s, "billing", "refund") - before; got != 1 {
		t.Fatalf("refund's handler ran %d times across the drift, want once (after the relist)", got)
	}

	// An agent granted only lookup_order is delivered only it, and its
	// call to refund is denied.
	ro := sdkMustConnect(t, kind, url, readonlyAgent)
	if got := ro.list(t); !slices.Equal(got, []string{"lookup_order"}) {
		t.Fatalf("delivered %v to the read-only agent, want only lookup_order", got)
	}
	before = starts(t, s, "billing", "refund")
	ro.mustDeny(t, "refund", sdkRefund40, "tool_not_granted")
	if starts(t, s, "billing", "refund") != before {
		t.Fatal("a refund not granted started its handler")
	}

	// A quiet listen stream carries the server's keep-alive comments
	// (each SDK's every 15 s), and goes on to carry the next change.
	time.Sleep(time.Until(changed.Add(rev2026KeepAlive)))
	redeployTo(t, s, "billing", "baseline")
	rev2026NextChange(t, a)

	if st := serverStats(t, s, "billing"); len(st.Refusals) != 0 {
		t.Fatalf("the server refused calls capsnap allowed: %v", st.Refusals)
	}
}

// rev2026KeepAlive is longer than the SDKs' servers leave a listen stream
// without a keep-alive comment.
const rev2026KeepAlive = 16 * time.Second

// rev2026NextChange fails unless the agent's listen stream's next change
// is a list_changed for tools.
func rev2026NextChange(t *testing.T, a *sdkAgent) {
	t.Helper()
	if st := a.do(t, sdkReq{Op: "next_event"}); !st.OK || st.Change != "ToolsListChanged" {
		t.Fatalf("next_event: %s, change %q; want ToolsListChanged", st.summary(), st.Change)
	}
}

// Raw HTTP, as a client that builds its own requests: a request whose
// headers disagree with its body, or that names a revision capsnap does not
// speak, is answered with MCP's own error for its id and HTTP 400, as the
// spec requires of a server (data.reason says which of capsnap's denials it
// is); and a listing capsnap filtered is private to its caller, whatever
// the server said, one it did not filter keeps the server's cacheScope.
func TestRev2026RawHTTP(t *testing.T) {
	s := rev2026Stack(t, rev2026Servers(t)[0])
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"%s","io.modelcontextprotocol/clientCapabilities":{}}`
	call := func(id, version string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"lookup_order","arguments":{"order_id":"A-100"},`+meta+`}}`, id, version)
	}
	for _, tc := range []struct {
		name    string
		headers map[string]string
		body    string
		id      string
		code    int
		reason  string
	}{
		{"mcp-method disagrees", map[string]string{"Mcp-Protocol-Version": rev2026, "Mcp-Method": "tools/list", "Mcp-Name": "lookup_order"},
			call(`7`, rev2026), `7`, -32020, "header_mismatch"},
		{"mcp-name disagrees", map[string]string{"Mcp-Protocol-Version": rev2026, "Mcp-Method": "tools/call", "Mcp-Name": "refund"},
			call(`"call-8"`, rev2026), `"call-8"`, -32020, "header_mismatch"},
		{"mcp-method missing", map[string]string{"Mcp-Protocol-Version": rev2026, "Mcp-Name": "lookup_order"},
			call(`9`, rev2026), `9`, -32020, "header_mismatch"},
		{"version header disagrees with _meta", map[string]string{"Mcp-Protocol-Version": "2025-11-25", "Mcp-Method": "tools/call", "Mcp-Name": "lookup_order"},
			call(`10`, rev2026), `10`, -32020, "header_mismatch"},
		// A revision capsnap does not speak: named in _meta, the body is
		// one capsnap cannot read (malformed_request); in the header
		// alone, the header disagrees with the body (header_mismatch).
		{"unsupported version", map[string]string{"Mcp-Protocol-Version": "2099-01-01", "Mcp-Method": "tools/call", "Mcp-Name": "lookup_order"},
			call(`11`, "2099-01-01"), `11`, -32022, "malformed_request"},
		{"unsupported version header", map[string]string{"Mcp-Protocol-Version": "2099-01-01", "Mcp-Method": "tools/call", "Mcp-Name": "lookup_order"},
			call(`12`, rev2026), `12`, -32022, "header_mismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := postWith(t, s, supportAgent, tc.body, tc.headers)
			msg := rev2026MustRefuse(t, resp, body, tc.id, tc.code, tc.reason)
			if tc.code == -32022 && (!slices.Contains(msg.Error.Data.Supported, rev2026) || msg.Error.Data.Requested != "2099-01-01") {
				t.Fatalf("unsupported version data %s, want supported to name %s and requested 2099-01-01", body, rev2026)
			}
		})
	}
	if got := starts(t, s, "billing", "lookup_order"); got != 0 {
		t.Fatalf("lookup_order's handler ran %d times, want never", got)
	}

	// The server says its list is public, for five minutes.
	list := fmt.Sprintf(`{"jsonrpc":"2.0","id":20,"method":"tools/list","params":{`+meta+`}}`, rev2026)
	headers := map[string]string{"Mcp-Protocol-Version": rev2026, "Mcp-Method": "tools/list"}
	for _, tc := range []struct {
		principal string
		tools     []string
		scope     string
	}{
		{readonlyAgent, []string{"lookup_order"}, "private"},
		{supportAgent, []string{"lookup_order", "refund"}, "public"},
	} {
		resp, body := postWith(t, s, tc.principal, list, headers)
		var msg struct {
			Result struct {
				Tools []struct {
					Name string `json:"name"`
				} `json:"tools"`
				TTLMs      int64  `json:"ttlMs"`
				CacheScope string `json:"cacheScope"`
			} `json:"result"`
		}
		if err := json.Unmarshal(body, &msg); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("tools/list as %s: HTTP %d %s: %v", tc.principal, resp.StatusCode, body, err)
		}
		var names []string
		for _, tool := range msg.Result.Tools {
			names = append(names, tool.Name)
		}
		r := msg.Result
		if !slices.Equal(sdkSorted(names), tc.tools) || r.CacheScope != tc.scope || r.TTLMs <= 0 || r.TTLMs > rev2026ListTTL.Milliseconds() {
			t.Fatalf("tools/list as %s: %s; want %v, cacheScope %q, ttlMs within the server's and the snapshot's", tc.principal, body, tc.tools, tc.scope)
		}
	}
}

// rev2026Refusal is MCP's own error, as capsnap answers a request it
// refuses for its headers or revision.
type rev2026Refusal struct {
	ID    json.RawMessage `json:"id"`
	Error struct {
		Code int `json:"code"`
		Data struct {
			Reason    string   `json:"reason"`
			Supported []string `json:"supported"`
			Requested string   `json:"requested"`
		} `json:"data"`
	} `json:"error"`
}

// rev2026MustRefuse fails unless resp, whose body is body, is HTTP 400
// with MCP's error code for the request id, data.reason saying which of
// capsnap's denials it is.
func rev2026MustRefuse(t *testing.T, resp *http.Response, body []byte, id string, code int, reason string) rev2026Refusal {
	t.Helper()
	var msg rev2026Refusal
	if err := json.Unmarshal(body, &msg); err != nil {
		t.Fatalf("HTTP %d %s: %v", resp.StatusCode, body, err)
	}
	if resp.StatusCode != http.StatusBadRequest || msg.Error.Code != code || string(msg.ID) != id || msg.Error.Data.Reason != reason {
		t.Fatalf("HTTP %d %s, want 400 with code %d, id %s and reason %s", resp.StatusCode, body, code, id, reason)
	}
	return msg
}

// rev2026Wire fails unless st's HTTP requests include method's, answered
// with status and contentType.
func rev2026Wire(t *testing.T, st sdkStep, method string, status int, contentType string) {
	t.Helper()
	for _, h := range st.HTTP {
		if h.Method == method && h.Status == status && strings.HasPrefix(h.ContentType, contentType) {
			return
		}
	}
	t.Fatalf("%s: no %s answered %d %s on the wire: %s", st.Step, method, status, contentType, st.summary())
}

// rev2026WaitCatalog waits until capsnap's view of billing has tool at
// another digest than was.
func rev2026WaitCatalog(t *testing.T, s *testbed.Stack, tool, was string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for refCatalog(t, s)[tool] == was {
		if time.Now().After(deadline) {
			t.Fatalf("capsnap's view of billing still has %s at %s", tool, was)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
