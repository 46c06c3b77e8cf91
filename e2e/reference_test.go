//go:build e2e

//lint:file-ignore SA1019 agents that declare roots and sampling, deprecated by 2026-07-28 and still what servers key tools on for older clients

package e2e

// The response path against a server no one here wrote: the official
// reference server, @modelcontextprotocol/server-everything from npm
// (pinned in e2e/clients/ts/package.json, installed with the TypeScript
// client by e2e/clients/install.sh), run as both of the stack's servers
// over streamable HTTP, behind the real Envoy. Agents on the Go SDK and on
// the TypeScript SDK (e2e/clients/ts/client.mjs) are delivered exactly what
// the policy grants, at the digests the server itself lists, and capsnap
// denies the rest.
//
// How it runs (read from the package's dist/): `node dist/index.js
// streamableHttp` serves MCP at /mcp on $PORT (on every interface: it has
// no host setting), statefully: a session begins with initialize, and a
// request without Mcp-Session-Id that is not one is refused with 400, as is
// a bare GET of /mcp. Its protocol versions are the TypeScript SDK's, up
// to 2025-11-25. Its tools/list answers are event streams that open with an
// empty priming event (its event store makes streams resumable).
//
// Some of its tools are registered per session, after initialize, only
// when the client declared a capability: get-roots-list (roots),
// trigger-sampling-request (sampling), trigger-elicitation-request
// (elicitation), trigger-url-elicitation (elicitation.url), and two that
// also need the client's tasks capability.
//
// Without CAPSNAP_E2E_NODE these tests fail, never skip.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/pincheck"
	"github.com/capsnap/capsnap/testbed"
)

// refPackage is the reference server's npm package, at the version
// e2e/clients/ts/package.json pins.
const (
	refPackage = "@modelcontextprotocol/server-everything"
	refVersion = "2026.8.31"
)

// refProtocol is the newest protocol version the server speaks, which
// the agents negotiate unless told otherwise.
const refProtocol = "2025-11-25"

// refGoVersions are the versions the Go SDK agent asks for: the newest
// the server has, the one before, and the SDK's own default (""), which
// it offers first and negotiates down to refProtocol.
var refGoVersions = []string{refProtocol, "2025-06-18", ""}

const (
	// refAgent is granted get-sum and echo (in that order: what is
	// delivered comes in the server's order, not the policy's).
	refAgent = "spiffe://acme/agent/reference"
	// refSampler is granted echo and trigger-sampling-request, a tool the
	// server offers only to clients that declare sampling, and
	// trigger-url-elicitation, which it offers only to clients that
	// declare URL elicitation.
	refSampler = "spiffe://acme/agent/reference-sampler"
)

// refPolicy classifies echo, get-sum, get-env (it prints the server's
// whole environment: admin), trigger-sampling-request and
// trigger-url-elicitation, and leaves the server's other tools
// unclassified.
const refPolicy = `tools:
  - {server: billing, tool: echo, effect: read}
  - {server: billing, tool: get-sum, effect: read}
  - {server: billing, tool: get-env, effect: admin}
  - {server: billing, tool: trigger-sampling-request, effect: write}
  - {server: billing, tool: trigger-url-elicitation, effect: write}
principals:
  - id: spiffe://acme/agent/reference
    grants:
      - {server: billing, tools: [get-sum, echo]}
  - id: spiffe://acme/agent/reference-sampler
    grants:
      - {server: billing, tools: [echo, trigger-sampling-request, trigger-url-elicitation]}
`

// What the pinned server lists: to a client that declares no capability,
// and to one that declares what capsnap's catalog session declares (roots,
// sampling, and elicitation as the Go SDK declares it: form only).
var (
	refPlainTools = []string{
		"echo", "get-annotated-message", "get-env", "get-resource-links", "get-resource-reference",
		"get-structured-content", "get-sum", "get-tiny-image", "gzip-file-as-resource",
		"toggle-simulated-logging", "toggle-subscriber-updates", "trigger-long-running-operation",
		"simulate-research-query",
	}
	refCapsnapTools = []string{
		"echo", "get-annotated-message", "get-env", "get-resource-links", "get-resource-reference",
		"get-structured-content", "get-sum", "get-tiny-image", "gzip-file-as-resource",
		"toggle-simulated-logging", "toggle-subscriber-updates", "trigger-long-running-operation",
		"get-roots-list", "trigger-elicitation-request", "trigger-url-elicitation", "trigger-sampling-request",
		"simulate-research-query",
	}
)

// Arguments each called tool accepts.
var refArgs = map[string]map[string]any{
	"echo":                           {"message": "through capsnap"},
	"get-sum":                        {"a": 2, "b": 3},
	"get-env":                        {},
	"get-tiny-image":                 {},
	"trigger-long-running-operation": {"duration": 1, "steps": 1},
	"trigger-sampling-request":       {"prompt": "Say hi", "maxTokens": 10},
	"trigger-url-elicitation":        {"url": "https://example.com/consent"},
}

const refTimeout = 20 * time.Second

// refServer returns node and the reference server's script, and fails
// the test unless both are there at the pinned version.
func refServer(t *testing.T) (node, script string) {
	t.Helper()
	const how = "run `make e2e`, which installs it with the TypeScript MCP SDK client (bash e2e/clients/install.sh) and sets CAPSNAP_E2E_NODE; by hand: bash e2e/clients/install.sh && CAPSNAP_E2E_NODE=$(which node) go test -tags e2e ./e2e/"
	node = os.Getenv("CAPSNAP_E2E_NODE")
	if node == "" {
		t.Fatalf("CAPSNAP_E2E_NODE is empty: it must name node, which runs %s; %s", refPackage, how)
	}
	if _, err := exec.LookPath(node); err != nil {
		t.Fatalf("%v; %s", err, how)
	}
	dir, err := filepath.Abs(filepath.Join("clients", "ts", "node_modules", refPackage))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		t.Fatalf("%s is not installed (%v); %s", refPackage, err, how)
	}
	var pkg struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(b, &pkg); err != nil || pkg.Version != refVersion {
		t.Fatalf("%s is installed at %q (%v), want the pinned %s; %s", refPackage, pkg.Version, err, refVersion, how)
	}
	return node, filepath.Join(dir, "dist", "index.js")
}

// refStack runs the stack with the reference server as both of its
// servers, under refPolicy.
func refStack(t *testing.T) *testbed.Stack {
	t.Helper()
	node, script := refServer(t)
	return startStackWith(t, func(o *testbed.StackOptions) {
		o.Policy = []byte(refPolicy)
		o.ServerCommand = func(_, addr string) (string, []string, []string) {
			_, port, _ := net.SplitHostPort(addr)
			return node, []string{script, "streamableHttp"}, []string{"PORT=" + port}
		}
	})
}

// refCaps are the client capabilities an agent declares.
type refCaps struct {
	roots, sampling, elicitation, urlElicitation bool
}

// refDial opens a Go SDK session to url as principal, asking for version
// ("" for the SDK's default, which must end at refProtocol), declaring
// caps and nothing else, through a recorder.
func refDial(t *testing.T, url, principal, version string, caps refCaps) *deliveryClient {
	t.Helper()
	co := &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}}
	if caps.roots {
		co.Capabilities.RootsV2 = &mcp.RootCapabilities{ListChanged: true}
	}
	if caps.sampling {
		co.CreateMessageHandler = func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			return &mcp.CreateMessageResult{Model: "capsnap-e2e", Role: "assistant", Content: &mcp.TextContent{Text: "hi from the agent"}}, nil
		}
	}
	if caps.elicitation || caps.urlElicitation {
		if caps.urlElicitation {
			co.Capabilities.Elicitation = &mcp.ElicitationCapabilities{Form: &mcp.FormElicitationCapabilities{}, URL: &mcp.URLElicitationCapabilities{}}
		}
		co.ElicitationHandler = func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "decline"}, nil
		}
	}
	want := version
	if want == "" {
		want = refProtocol
	}
	return dialRecorded(t, url, principal, version, want, co)
}

// refListing is one tools/list: what the SDK decoded, and the raw
// definitions in the response body the client read.
type refListing struct {
	Tools []*mcp.Tool
	// Raw are the tools/list result's definitions as sent, in order.
	Raw []json.RawMessage
	// Epoch is the x-capsnap-epoch of the response ("" straight from the
	// server).
	Epoch string
	Body  []byte
}

func (l refListing) names() []string {
	var out []string
	for _, tl := range l.Tools {
		out = append(out, tl.Name)
	}
	return out
}

// digests are each listed tool's schema digest: of the definition as the
// Go SDK decoded it (pincheck.Digest, which a Go server computes of its
// own) and of the raw definition in the body (mcpparse.ToolDigest). The
// two must agree.
func (l refListing) digests(t *testing.T) map[string]string {
	t.Helper()
	if len(l.Raw) != len(l.Tools) {
		t.Fatalf("the body holds %d definitions, the SDK decoded %d", len(l.Raw), len(l.Tools))
	}
	out := map[string]string{}
	for i, tl := range l.Tools {
		sdk, err := pincheck.Digest(tl)
		if err != nil {
			t.Fatal(err)
		}
		raw, _, err := mcpparse.ToolDigest(l.Raw[i])
		if err != nil {
			t.Fatalf("%s: %v", tl.Name, err)
		}
		if sdk != raw {
			t.Fatalf("%s: digest %s of the definition as sent, %s as the Go SDK decoded it:\n%s", tl.Name, raw, sdk, l.Raw[i])
		}
		out[tl.Name] = sdk
	}
	return out
}

// refList lists one page of tools (the reference server does not paginate);
// through Envoy it then names the epoch capsnap returned on later requests.
func (c *deliveryClient) refList(t *testing.T) refListing {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), refTimeout)
	defer cancel()
	res, err := c.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	if res.NextCursor != "" {
		t.Fatalf("tools/list has a nextCursor %q: the server paginates now", res.NextCursor)
	}
	ex := c.rec.last(t, "tools/list")
	l := refListing{Tools: res.Tools, Epoch: ex.Header.Get(testbed.EpochHeader), Body: ex.Body()}
	l.Raw = refRawTools(t, ex.Header.Get("Content-Type"), l.Body, ex.ID)
	if l.Epoch != "" {
		c.agent.Send(testbed.EpochHeader, l.Epoch)
	}
	return l
}

// refRawTools reads, without capsnap's parser, the definitions of the
// tools/list result for id in body: a JSON response, or an event stream
// one of whose events is.
func refRawTools(t *testing.T, contentType string, body []byte, id json.RawMessage) []json.RawMessage {
	t.Helper()
	var docs [][]byte
	if strings.HasPrefix(contentType, "text/event-stream") {
		var data [][]byte
		flush := func() {
			if len(data) > 0 {
				docs = append(docs, bytes.Join(data, []byte("\n")))
			}
			data = nil
		}
		sc := bufio.NewScanner(bytes.NewReader(body))
		sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
		for sc.Scan() {
			line := sc.Bytes()
			switch {
			case len(line) == 0:
				flush()
			case bytes.HasPrefix(line, []byte("data:")):
				data = append(data, bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("data:")), []byte(" ")))
			}
		}
		flush()
	} else {
		docs = [][]byte{body}
	}
	for _, doc := range docs {
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Result *struct {
				Tools []json.RawMessage `json:"tools"`
			} `json:"result"`
		}
		if len(bytes.TrimSpace(doc)) == 0 || json.Unmarshal(doc, &msg) != nil {
			continue
		}
		if string(msg.ID) == string(id) && msg.Result != nil {
			return msg.Result.Tools
		}
	}
	t.Fatalf("no tools/list result for id %s in the %s body:\n%s", id, contentType, body)
	return nil
}

// refDirect lists the billing server's tools straight from it, bypassing
// Envoy and capsnap, as a client declaring caps.
func refDirect(t *testing.T, s *testbed.Stack, caps refCaps) refListing {
	t.Helper()
	c := refDial(t, s.ServerURL("billing")+"/mcp", refAgent, refProtocol, caps)
	l := c.refList(t)
	if l.Epoch != "" {
		t.Fatalf("the server itself answered with epoch %q", l.Epoch)
	}
	return l
}

// refCatalog is capsnap's own view of billing, by tool name.
func refCatalog(t *testing.T, s *testbed.Stack) map[string]string {
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
	if e := view["billing"].LastError; e != "" {
		t.Fatalf("capsnap's view of billing is failing: %s", e)
	}
	out := map[string]string{}
	for _, tl := range view["billing"].Tools {
		out[tl.Name] = tl.Digest
	}
	return out
}

// refKeep is names filtered to keep, in names' order.
func refKeep(names, keep []string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return !slices.Contains(keep, n) })
}

// refCheckDelivered fails unless got, delivered through Envoy, is exactly
// the tools of direct that want names, in direct's order, each at the
// digest the server itself listed, with an epoch, and its body names none
// of the others.
func refCheckDelivered(t *testing.T, got, direct refListing, want []string) {
	t.Helper()
	if !strings.HasPrefix(got.Epoch, "ep_") {
		t.Fatalf("tools/list through Envoy: epoch header %q, want an ep_ epoch", got.Epoch)
	}
	wantNames := refKeep(direct.names(), want)
	if !slices.Equal(got.names(), wantNames) {
		t.Fatalf("delivered %v, want exactly %v in the server's order (it listed %v)", got.names(), wantNames, direct.names())
	}
	own := direct.digests(t)
	for name, d := range got.digests(t) {
		if d != own[name] {
			t.Fatalf("%s delivered at %s, the server itself lists it at %s", name, d, own[name])
		}
	}
	for _, name := range direct.names() {
		if !slices.Contains(want, name) && bytes.Contains(got.Body, []byte(`"`+name+`"`)) {
			t.Fatalf("the delivered body names %s, which it must withhold:\n%s", name, got.Body)
		}
	}
}

// refCall calls tool through c and returns how it ended (see
// deliveryOutcome) and the result's text.
func (c *deliveryClient) refCall(t *testing.T, tool string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), refTimeout)
	defer cancel()
	res, err := c.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: refArgs[tool]})
	r, _ := deliveryOutcome(res, err)
	text := ""
	if err == nil {
		for _, ct := range res.Content {
			if tc, ok := ct.(*mcp.TextContent); ok {
				text += tc.Text
			}
		}
	}
	return r, text
}

func (c *deliveryClient) refMustAllow(t *testing.T, tool, wantText string) {
	t.Helper()
	r, text := c.refCall(t, tool)
	if r != "" {
		t.Fatalf("%s: %q, want it allowed", tool, r)
	}
	if !strings.Contains(text, wantText) {
		t.Fatalf("%s answered %q, want the server's own answer with %q", tool, text, wantText)
	}
}

func (c *deliveryClient) refMustDeny(t *testing.T, tool, reason string) {
	t.Helper()
	if r, _ := c.refCall(t, tool); r != reason {
		t.Fatalf("%s: %q, want capsnap's %s", tool, r, reason)
	}
	if ex := c.rec.last(t, "tools/call"); ex.Status != http.StatusOK || ex.Header.Get("x-capsnap-reason") != reason {
		t.Fatalf("%s: answered %d with x-capsnap-reason %q, want capsnap's 200 %s", tool, ex.Status, ex.Header.Get("x-capsnap-reason"), reason)
	}
}

// refAudit is one of capsnap's audit lines of a tools/list response.
type refAudit struct {
	Log         string `json:"log"`
	Phase       string `json:"phase"`
	Decision    string `json:"decision"`
	Reason      string `json:"reason"`
	Principal   string `json:"principal"`
	ServerID    string `json:"server_id"`
	Session     string `json:"session"`
	Epoch       string `json:"epoch"`
	PinnedTools int    `json:"pinned_tools"`
	Withheld    []struct {
		Tool   string `json:"tool"`
		Reason string `json:"reason"`
		Detail string `json:"detail"`
	} `json:"withheld"`
}

// refAuditOf is capsnap's audit line of the tools/list response that
// match picks; it fails unless there is exactly one.
func refAuditOf(t *testing.T, s *testbed.Stack, what string, match func(refAudit) bool) refAudit {
	t.Helper()
	var found []refAudit
	// The line is written as the response passes: wait for it briefly.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		found = nil
		for _, line := range strings.Split(s.Capsnap.Output(), "\n") {
			var a refAudit
			if json.Unmarshal([]byte(line), &a) == nil && a.Log == "audit" && a.Phase == "response" && match(a) {
				found = append(found, a)
			}
		}
		if len(found) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d audit lines of the tools/list response %s, want 1", len(found), what)
	}
	return found[0]
}

// refCheckAudit fails unless a shows a delivery to principal that
// withheld exactly the tools of withheld, each for its reason.
func refCheckAudit(t *testing.T, a refAudit, principal string, pinned int, withheld map[string]string) {
	t.Helper()
	if a.Decision != "allow" || a.Reason != "ok" || a.Principal != principal || a.ServerID != "billing" || a.PinnedTools != pinned {
		t.Fatalf("audit line %+v, want an allowed delivery to %s on billing pinning %d tools", a, principal, pinned)
	}
	got := map[string]string{}
	for _, w := range a.Withheld {
		if _, dup := got[w.Tool]; dup {
			t.Fatalf("the audit line withholds %s twice", w.Tool)
		}
		if w.Detail == "" {
			t.Fatalf("the audit line withholds %s (%s) with no detail", w.Tool, w.Reason)
		}
		got[w.Tool] = w.Reason
	}
	if len(got) != len(withheld) {
		t.Fatalf("the audit line withholds %v, want %v", got, withheld)
	}
	for tool, reason := range withheld {
		if got[tool] != reason {
			t.Fatalf("the audit line withholds %v, want %v", got, withheld)
		}
	}
}

// refClassified are the tools refPolicy classifies.
var refClassified = []string{"echo", "get-sum", "get-env", "trigger-sampling-request", "trigger-url-elicitation"}

// refWithheld is what a delivery of direct that keeps exactly kept
// withholds, and why: tool_not_granted for a classified tool, else
// unclassified_tool, unless other names the reason.
func refWithheld(direct refListing, kept []string, other map[string]string) map[string]string {
	out := map[string]string{}
	for _, name := range direct.names() {
		switch {
		case slices.Contains(kept, name):
		case other[name] != "":
			out[name] = other[name]
		case slices.Contains(refClassified, name):
			out[name] = "tool_not_granted"
		default:
			out[name] = "unclassified_tool"
		}
	}
	return out
}

// capsnap's view of the reference server is what the server lists to a
// client declaring what capsnap's catalog session declares, at the same
// digests; an agent on the Go SDK and one on the TypeScript SDK are
// delivered exactly the two tools granted, in the server's order and at
// its digests, and may call them; capsnap denies the server's other tools,
// and its audit names each tool it withheld, with why.
func TestReferenceDelivered(t *testing.T) {
	s := refStack(t)
	node, _ := refServer(t)

	plain := refDirect(t, s, refCaps{})
	if !slices.Equal(plain.names(), refPlainTools) {
		t.Fatalf("%s@%s lists %v to a client with no capabilities, want %v", refPackage, refVersion, plain.names(), refPlainTools)
	}
	// What capsnap's own session declares: roots, sampling, elicitation
	// in both modes.
	all := refDirect(t, s, refCaps{roots: true, sampling: true, elicitation: true, urlElicitation: true})
	if !slices.Equal(all.names(), refCapsnapTools) {
		t.Fatalf("%s@%s lists %v to a client with roots, sampling and elicitation, want %v", refPackage, refVersion, all.names(), refCapsnapTools)
	}
	view := refCatalog(t, s)
	own := all.digests(t)
	if len(view) != len(own) {
		t.Fatalf("capsnap's view of billing has %d tools, the server lists %d to its capabilities:\nview %v\nserver %v", len(view), len(own), view, own)
	}
	for name, d := range own {
		if view[name] != d {
			t.Fatalf("capsnap's view has %s at %q, the server lists it at %s", name, view[name], d)
		}
	}
	t.Logf("the server lists %d tools to a plain client, %d to capsnap's capabilities; capsnap's view agrees", len(plain.Tools), len(all.Tools))

	granted := []string{"get-sum", "echo"}
	withheld := refWithheld(plain, granted, nil)

	for _, version := range refGoVersions {
		name := "go-" + version
		if version == "" {
			name = "go-default"
		}
		t.Run(name, func(t *testing.T) {
			c := refDial(t, s.RouteURL("billing"), refAgent, version, refCaps{})
			got := c.refList(t)
			refCheckDelivered(t, got, plain, granted)
			t.Logf("delivered through Envoy (epoch %s):\n%s", got.Epoch, got.Body)

			c.refMustAllow(t, "echo", "Echo: through capsnap")
			c.refMustAllow(t, "get-sum", "The sum of 2 and 3 is 5.")
			c.refMustDeny(t, "get-env", "tool_not_granted")
			c.refMustDeny(t, "get-tiny-image", "unclassified_tool")
			c.refMustDeny(t, "trigger-long-running-operation", "unclassified_tool")

			a := refAuditOf(t, s, "of epoch "+got.Epoch, func(a refAudit) bool { return a.Epoch == got.Epoch })
			refCheckAudit(t, a, refAgent, len(granted), withheld)
		})
	}

	t.Run("typescript", func(t *testing.T) {
		ts, err := filepath.Abs("clients/ts/client.mjs")
		if err != nil {
			t.Fatal(err)
		}
		kind := sdkKind{name: "typescript", start: func(t *testing.T, k sdkKind) sdkClient { return sdkStartProc(t, k.name, node, ts) }}
		a, st := sdkConnect(t, kind, s.RouteURL("billing"), refAgent)
		if !st.OK {
			t.Fatalf("[typescript] connect: %s", st.summary())
		}
		if st.ProtocolVersion != refProtocol || st.SessionID == "" {
			t.Fatalf("[typescript] connected at %q in session %q, want %s in a session", st.ProtocolVersion, st.SessionID, refProtocol)
		}
		// The TypeScript Client declares no capabilities: it is offered
		// what the plain Go client was.
		if got, want := a.list(t), refKeep(plain.names(), granted); !slices.Equal(got, want) {
			t.Fatalf("[typescript] delivered %v, want exactly %v in the server's order", got, want)
		}
		if text := a.mustAllow(t, "echo", refArgs["echo"]); text != "Echo: through capsnap" {
			t.Fatalf("[typescript] echo answered %q", text)
		}
		if text := a.mustAllow(t, "get-sum", refArgs["get-sum"]); text != "The sum of 2 and 3 is 5." {
			t.Fatalf("[typescript] get-sum answered %q", text)
		}
		if d := a.mustDeny(t, "get-env", refArgs["get-env"], "tool_not_granted"); !slices.Equal(sdkSorted(d.AllowedTools), []string{"echo", "get-sum"}) {
			t.Fatalf("[typescript] get-env's denial names allowed_tools %v, want echo and get-sum", d.AllowedTools)
		}
		a.mustDeny(t, "get-tiny-image", refArgs["get-tiny-image"], "unclassified_tool")

		au := refAuditOf(t, s, "in session "+st.SessionID, func(a refAudit) bool { return a.Session == st.SessionID })
		if !strings.HasPrefix(au.Epoch, "ep_") {
			t.Fatalf("the TypeScript client's delivery minted epoch %q", au.Epoch)
		}
		refCheckAudit(t, au, refAgent, len(granted), withheld)
	})
}

// A tool the server offers only to clients that declare sampling: capsnap's
// catalog session declares sampling, so its view has the tool; an agent
// that declares it is delivered it, and its call, in which the server asks
// the agent's model through Envoy, is allowed; an agent that does not is
// never delivered it, and capsnap denies its call. A tool the server
// offers only to clients that declare URL elicitation is delivered only if
// capsnap's view has it.
func TestReferenceCapabilityGated(t *testing.T) {
	s := refStack(t)
	node, _ := refServer(t)
	view := refCatalog(t, s)
	if view["trigger-sampling-request"] == "" {
		t.Fatalf("capsnap's view of billing has no trigger-sampling-request, though its session declares sampling: %v", view)
	}
	granted := []string{"echo", "trigger-sampling-request"}

	t.Run("sampling", func(t *testing.T) {
		direct := refDirect(t, s, refCaps{sampling: true})
		if !slices.Contains(direct.names(), "trigger-sampling-request") {
			t.Fatalf("the server does not offer trigger-sampling-request to a client with sampling: %v", direct.names())
		}
		c := refDial(t, s.RouteURL("billing"), refSampler, refProtocol, refCaps{sampling: true})
		got := c.refList(t)
		refCheckDelivered(t, got, direct, granted)
		c.refMustAllow(t, "trigger-sampling-request", "hi from the agent")
		c.refMustAllow(t, "echo", "Echo: through capsnap")
		a := refAuditOf(t, s, "of epoch "+got.Epoch, func(a refAudit) bool { return a.Epoch == got.Epoch })
		refCheckAudit(t, a, refSampler, len(granted), refWithheld(direct, granted, nil))
	})

	t.Run("no sampling", func(t *testing.T) {
		direct := refDirect(t, s, refCaps{})
		if slices.Contains(direct.names(), "trigger-sampling-request") {
			t.Fatalf("the server offers trigger-sampling-request to a client without sampling: %v", direct.names())
		}
		c := refDial(t, s.RouteURL("billing"), refSampler, refProtocol, refCaps{})
		got := c.refList(t)
		refCheckDelivered(t, got, direct, granted)
		// capsnap's view has it and the policy grants it, but this
		// agent's snapshot never pinned it.
		c.refMustDeny(t, "trigger-sampling-request", "no_snapshot")
		c.refMustAllow(t, "echo", "Echo: through capsnap")

		ts, err := filepath.Abs("clients/ts/client.mjs")
		if err != nil {
			t.Fatal(err)
		}
		kind := sdkKind{name: "typescript", start: func(t *testing.T, k sdkKind) sdkClient { return sdkStartProc(t, k.name, node, ts) }}
		tsa := sdkMustConnect(t, kind, s.RouteURL("billing"), refSampler)
		if got := tsa.list(t); !slices.Equal(got, []string{"echo"}) {
			t.Fatalf("[typescript] delivered %v, want only echo", got)
		}
		tsa.mustDeny(t, "trigger-sampling-request", refArgs["trigger-sampling-request"], "no_snapshot")
	})

	// capsnap's catalog session declares elicitation as the Go SDK does,
	// form only: whether the server then offers it trigger-url-elicitation
	// decides whether an agent that declares URL elicitation may be
	// delivered it. Either way nothing capsnap's view lacks is delivered.
	t.Run("url elicitation", func(t *testing.T) {
		direct := refDirect(t, s, refCaps{elicitation: true, urlElicitation: true})
		if !slices.Contains(direct.names(), "trigger-url-elicitation") {
			t.Fatalf("the server does not offer trigger-url-elicitation to a client with URL elicitation: %v", direct.names())
		}
		c := refDial(t, s.RouteURL("billing"), refSampler, refProtocol, refCaps{elicitation: true, urlElicitation: true})
		got := c.refList(t)
		want := []string{"echo"}
		inView := view["trigger-url-elicitation"] != ""
		if inView {
			want = append(want, "trigger-url-elicitation")
		}
		refCheckDelivered(t, got, direct, want)
		a := refAuditOf(t, s, "of epoch "+got.Epoch, func(a refAudit) bool { return a.Epoch == got.Epoch })
		wantWithheld := refWithheld(direct, want, map[string]string{"trigger-url-elicitation": "unknown_tool"})
		refCheckAudit(t, a, refSampler, len(want), wantWithheld)
		if !inView {
			c.refMustDeny(t, "trigger-url-elicitation", "unknown_tool")
			t.Logf("capsnap's view lacks trigger-url-elicitation (its session does not declare elicitation.url): withheld as unknown_tool, though granted")
		}
	})
}
