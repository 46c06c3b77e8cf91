//go:build e2e

package e2e

// A tools/list result on a stream that is not its own request's answer,
// through the real Envoy: the GET event stream (fresh, or resumed with
// Last-Event-ID), another request's event stream, another request's JSON
// batch. A client takes a response on any stream for the answer to its
// pending request of the same id, so such a listing would reach it
// unfiltered and unpinned. The fixture (testbed/cmd/mcpfixture, its
// x-fixture-misroute header) sends one as a hostile server would; capsnap
// withholds it, a listing_unbound JSON-RPC error for its id in its place,
// and passes everything beside it byte for byte.

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/testbed"
)

const (
	misrouteHeader = "x-fixture-misroute"
	misrouteMarker = "mcpfixture-misrouted-listing"
)

func TestListingOnAnotherStreamIsWithheld(t *testing.T) {
	s := deliveryStack(t, "", nil)
	client := &http.Client{Timeout: 10 * time.Second}
	ping := `{"jsonrpc":"2.0","id":5,"method":"ping"}`
	tests := []struct {
		name, how, method, body string
		extra                   map[string]string
		// want are what the client must get, in order; withheld the ids of
		// the listings withheld.
		want     []string
		withheld []string
	}{
		{name: "GET event stream", how: "get", method: http.MethodGet,
			want: []string{
				`id: e1` + "\n" + `event: message` + "\n" + `data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}` + "\n\n",
				`id: e2` + "\n" + `event: message` + "\n" + `data: {"jsonrpc":"2.0","id":"stolen","error":{"code":-31000,"message":"capsnap denied the request: listing_unbound"`,
				`id: e3` + "\n" + `event: message` + "\n" + `data: {"jsonrpc":"2.0","id":"srv-1","method":"ping"}` + "\n\n",
			}, withheld: []string{`"stolen"`}},
		{name: "resumed with Last-Event-ID", how: "get", method: http.MethodGet, extra: map[string]string{"Last-Event-ID": "e0"},
			want: []string{`data: {"jsonrpc":"2.0","id":"stolen","error":{"code":-31000,`}, withheld: []string{`"stolen"`}},
		{name: "another request's event stream", how: "sse", method: http.MethodPost, body: ping,
			want: []string{
				`event: message` + "\n" + `data: {"jsonrpc":"2.0","id":99,"error":{"code":-31000,"message":"capsnap denied the request: listing_unbound"`,
				`event: message` + "\n" + `data: {"jsonrpc":"2.0","id":5,"result":{}}` + "\n\n",
			}, withheld: []string{"99"}},
		{name: "another request's JSON batch", how: "json", method: http.MethodPost, body: ping,
			want:     []string{`[{"jsonrpc":"2.0","id":5,"result":{}},{"jsonrpc":"2.0","id":99,"error":{"code":-31000,"message":"capsnap denied the request: listing_unbound"`},
			withheld: []string{"99"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := faultMetric(t, s, "capsnap_deliveries_total", "result", "listing_unbound")
			h := map[string]string{misrouteHeader: tt.how}
			maps.Copy(h, tt.extra)
			resp, body, err := agentRequest(client, s, tt.method, tt.body, h)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d:\n%s", resp.StatusCode, body)
			}
			if bytes.Contains(body, []byte(misrouteMarker)) || bytes.Contains(body, []byte("wipe_ledger")) {
				t.Fatalf("the misrouted listing reached the client:\n%s", body)
			}
			rest := string(body)
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("the client got:\n%s\nwhich lacks, in order:\n%s", body, w)
				}
				rest = rest[i+len(w):]
			}
			if got := faultMetric(t, s, "capsnap_deliveries_total", "result", "listing_unbound") - before; int(got) != len(tt.withheld) {
				t.Errorf("listing_unbound counted %v times, want %d", got, len(tt.withheld))
			}
			for _, id := range tt.withheld {
				misrouteAudited(t, s, id)
			}
		})
	}
}

// agentRequest sends a request of method with body through Envoy as the
// delivery agent in a 2025-11-25 session, with headers (the fixture's
// modes among them) besides MCP's, and returns what the client got, body
// and all.
func agentRequest(client *http.Client, s *testbed.Stack, method, body string, headers map[string]string) (*http.Response, []byte, error) {
	req, err := http.NewRequest(method, s.MCPURL(), strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set(testbed.PrincipalHeader, deliveryAgent)
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("Mcp-Session-Id", "misroute-session")
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// misrouteAudited waits for capsnap's audit line of the listing withheld
// for id.
func misrouteAudited(t *testing.T, s *testbed.Stack, id string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, line := range strings.Split(s.Capsnap.Output(), "\n") {
			var a struct {
				Decision, Reason, Phase string
				ServerID                string          `json:"server_id"`
				ID                      json.RawMessage `json:"jsonrpc_id"`
			}
			if json.Unmarshal([]byte(line), &a) == nil && a.Reason == "listing_unbound" && a.Decision == "deny" &&
				a.Phase == "response" && a.ServerID == "billing" && string(a.ID) == id {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listing_unbound audit line for id %s", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The same with the official SDK clients: a server answers the agent's
// first tools/list on the session's GET event stream instead of its POST
// (the fixture's get-stream mode). Straight from the server, every client
// takes that list (wipe_ledger, granted to no one, included); through
// Envoy and capsnap, the client's tools/list fails with capsnap's
// listing_unbound, and the agent's next list is delivered, pinned and
// callable.
func TestSDKListingOnTheGETStream(t *testing.T) {
	s := deliveryStack(t, "", nil)
	for _, kind := range sdkKinds(t) {
		if kind.name == "go" || kind.name == "python-client" {
			// They negotiate 2026-07-28 here: no sessions and no GET
			// stream, whose list_changed comes on subscriptions/listen.
			continue
		}
		t.Run(kind.name, func(t *testing.T) {
			connect := func(url, principal string) *sdkAgent {
				a := &sdkAgent{kind: kind, c: kind.start(t, kind)}
				h := map[string]string{misrouteHeader: "get-stream"}
				if principal != "" {
					h[testbed.PrincipalHeader] = principal
				}
				if st := a.do(t, sdkReq{Op: "connect", URL: url, Headers: h, API: kind.api}); !st.OK {
					t.Fatalf("[%s] connect to %s: %s", kind.name, url, st.summary())
				}
				return a
			}

			direct := connect(s.ServerURL("billing")+"/mcp", "")
			if tools := direct.list(t); !slices.Contains(tools, "wipe_ledger") {
				t.Fatalf("[%s] straight from the server the GET stream's list is %v: the client did not take it, so this shows nothing", kind.name, tools)
			}

			a := connect(s.MCPURL(), deliveryAgent)
			st := a.do(t, sdkReq{Op: "list"})
			if d := a.denialOf(t, st); d.Reason != "listing_unbound" || d.ReturnTo != "planning" {
				t.Fatalf("[%s] the listing on the GET stream: %+v, want listing_unbound, return to planning", kind.name, d)
			}
			tools := a.list(t)
			if slices.Contains(tools, "wipe_ledger") || !slices.Contains(tools, "lookup_order") {
				t.Fatalf("[%s] listed again: %v, want the granted tools", kind.name, tools)
			}
			a.mustAllow(t, "lookup_order", map[string]any{"order_id": "A-100"})
		})
	}
}
