//go:build e2e

package e2e

// Issue 35: a tools/list answer in a framing that capsnap could read one
// way and an MCP client another (testbed/cmd/mcpfixture's
// x-fixture-framing), on a listing's own POST, the GET stream and a
// resumed stream (x-fixture-misroute), through the real Envoy, to the
// official TypeScript and Python SDK clients. Straight from the server, the SDK clients take
// the server's whole list (wipe_ledger, granted to no one, included);
// through capsnap none of them ever does: the answer is withheld whole,
// malformed_response, audited and counted.

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/testbed"
)

const (
	framingHeader = "x-fixture-framing"
	abortHeader   = "x-fixture-abort"
)

func TestSDKFramings(t *testing.T) {
	s := deliveryStack(t, "", nil)
	for _, tt := range []struct {
		name, framing, misroute string
	}{
		{"own POST, JSON with the event stream in a parameter", "json-profile", ""},
		{"own POST, both types as the Accept header names them", "json-both", ""},
		{"own POST, events in UTF-16", "sse-utf16", ""},
		{"GET stream, events as text/plain", "sse-plain", "get-stream"},
		{"GET stream, events with no Content-Type", "sse-none", "get-stream"},
		{"GET stream, events in UTF-16", "sse-utf16", "get-stream"},
		{"resumed stream, events as text/plain", "sse-plain", "resume"},
		{"resumed stream, events in UTF-16", "sse-utf16", "resume"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Which clients take the unfiltered list straight from the
			// server: a framing none reads shows nothing.
			var readers []string
			for _, kind := range sdkKinds(t) {
				if kind.name == "go" || kind.name == "go-2025-11-25" {
					continue // the clients are TypeScript and Python
				}
				if tt.misroute != "" && kind.name == "python-client" {
					// It negotiates 2026-07-28: no session, no GET stream,
					// nothing to resume.
					continue
				}
				connect := func(url, principal string) *sdkAgent {
					a := &sdkAgent{kind: kind, c: kind.start(t, kind)}
					h := map[string]string{framingHeader: tt.framing}
					if tt.misroute != "" {
						h[misrouteHeader] = tt.misroute
					}
					if principal != "" {
						h[testbed.PrincipalHeader] = principal
					}
					if st := a.do(t, sdkReq{Op: "connect", URL: url, Headers: h, API: kind.api}); !st.OK {
						t.Fatalf("[%s] connect to %s: %s", kind.name, url, st.summary())
					}
					return a
				}

				direct := connect(s.ServerURL("billing")+"/mcp", "")
				if st := direct.do(t, sdkReq{Op: "list", TimeoutMS: 5000}); st.OK && slices.Contains(st.Tools, "wipe_ledger") {
					readers = append(readers, kind.name)
				}

				before := faultMetric(t, s, "capsnap_deliveries_total", "result", "malformed_response")
				a := connect(s.MCPURL(), deliveryAgent)
				st := a.do(t, sdkReq{Op: "list", TimeoutMS: 5000})
				if st.OK && slices.Contains(st.Tools, "wipe_ledger") {
					t.Fatalf("[%s] through capsnap the client took the unfiltered list: %v", kind.name, st.Tools)
				}
				if st.OK && tt.misroute == "" {
					t.Fatalf("[%s] through capsnap the list was delivered: %s, want it withheld", kind.name, st.summary())
				}
				if tt.misroute == "" {
					// Its own answer: the error for its id reaches it.
					if d := a.denialOf(t, st); d.Reason != "malformed_response" {
						t.Fatalf("[%s] %+v, want malformed_response", kind.name, d)
					}
				}
				waitMetric(t, s, "capsnap_deliveries_total", "result", "malformed_response", before+1)
			}
			if len(readers) == 0 {
				t.Fatalf("no SDK client took the list straight from the server in this framing: the case shows nothing")
			}
			t.Logf("straight from the server, %v took the unfiltered list", readers)
		})
	}
}

// waitMetric waits until a counter of capsnap's reaches at least want.
func waitMetric(t *testing.T, s *testbed.Stack, name, label, value string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := faultMetric(t, s, name, label, value)
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			out := s.Capsnap.Output()
			t.Fatalf("%s{%s=%q} = %v, want at least %v; capsnap's last output:\n%s", name, label, value, got, want, out[max(0, len(out)-4000):])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The same classes on the raw wire, where the SDK clients cannot be made
// to go (a stream resumed with Last-Event-ID, another request's stream):
// each answer that could carry a listing in a framing clients read
// differently is withheld whole, a 502 with capsnap's JSON-RPC error in
// its place; nothing of the listing reaches the client.
func TestFramingsOnEveryStream(t *testing.T) {
	s := deliveryStack(t, "", nil)
	client := &http.Client{Timeout: 10 * time.Second}
	ping := `{"jsonrpc":"2.0","id":5,"method":"ping"}`
	for _, tt := range []struct {
		name, how, method, body, framing string
		extra                            map[string]string
	}{
		{name: "GET stream as text/plain", how: "get", method: http.MethodGet, framing: "sse-plain"},
		{name: "GET stream with no Content-Type", how: "get", method: http.MethodGet, framing: "sse-none"},
		{name: "GET stream in UTF-16", how: "get", method: http.MethodGet, framing: "sse-utf16"},
		{name: "resumed stream as text/plain", how: "get", method: http.MethodGet, framing: "sse-plain", extra: map[string]string{"Last-Event-ID": "e0"}},
		{name: "resumed stream in UTF-16", how: "get", method: http.MethodGet, framing: "sse-utf16", extra: map[string]string{"Last-Event-ID": "e0"}},
		{name: "another request's stream in UTF-16", how: "sse", method: http.MethodPost, body: ping, framing: "sse-utf16"},
		{name: "another request's stream with no Content-Type", how: "sse", method: http.MethodPost, body: ping, framing: "sse-none"},
		{name: "another request's JSON naming an event stream", how: "json", method: http.MethodPost, body: ping, framing: "json-profile"},
		{name: "another request's JSON as both types", how: "json", method: http.MethodPost, body: ping, framing: "json-both"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := faultMetric(t, s, "capsnap_deliveries_total", "result", "malformed_response")
			h := map[string]string{misrouteHeader: tt.how, framingHeader: tt.framing}
			maps.Copy(h, tt.extra)
			resp, body, err := agentRequest(client, s, tt.method, tt.body, h)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(body, []byte(misrouteMarker)) || bytes.Contains(body, []byte("wipe_ledger")) || bytes.Contains(body, []byte("w\x00i\x00p\x00e")) {
				t.Fatalf("the listing reached the client:\n%q", body)
			}
			var e struct {
				ID    json.RawMessage `json:"id"`
				Error struct {
					Code int `json:"code"`
					Data struct {
						Reason string `json:"reason"`
					} `json:"data"`
				} `json:"error"`
			}
			if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Content-Type") != "application/json" ||
				json.Unmarshal(body, &e) != nil || e.Error.Code != -31000 || e.Error.Data.Reason != "malformed_response" {
				t.Fatalf("status %d, %s:\n%s\nwant a 502 with capsnap's malformed_response", resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			// The error answers the request it takes the answer of: the
			// ping's id 5; a GET stream's answers no request, null.
			if want := map[string]string{http.MethodPost: "5", http.MethodGet: "null"}[tt.method]; string(e.ID) != want {
				t.Fatalf("the error answers id %s, want %s:\n%s", e.ID, want, body)
			}
			waitMetric(t, s, "capsnap_deliveries_total", "result", "malformed_response", before+1)
		})
	}
}

// An event over discovery.max_response_bytes on the GET stream is withheld
// whole, an error event in its place, and the events after it pass: none
// of it passes in part, and the stream is not cut off.
func TestOversizedEventOnTheGETStream(t *testing.T) {
	s := deliveryStack(t, "", nil)
	before := faultMetric(t, s, "capsnap_deliveries_total", "result", "malformed_response")
	resp, body, err := agentRequest(&http.Client{Timeout: 20 * time.Second}, s, http.MethodGet, "", map[string]string{misrouteHeader: "get-big", "Accept": "text/event-stream"})
	if err != nil {
		t.Fatalf("the stream was cut off after %d bytes: %v", len(body), err)
	}
	if resp.StatusCode != http.StatusOK || bytes.Contains(body, []byte("xxxxxxxx")) {
		t.Fatalf("status %d, %d bytes: part of the oversized event passed", resp.StatusCode, len(body))
	}
	rest := string(body)
	for _, w := range []string{
		"id: e1\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"",
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-31000,\"message\":\"capsnap denied the request: malformed_response\"",
		"id: e3\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"srv-1\",\"method\":\"ping\"}\n\n",
	} {
		i := strings.Index(rest, w)
		if i < 0 {
			t.Fatalf("the client got:\n%s\nwhich lacks, in order:\n%s", body, w)
		}
		rest = rest[i+len(w):]
	}
	waitMetric(t, s, "capsnap_deliveries_total", "result", "malformed_response", before+1)
}

// A server that aborts its answer to a tools/list mid-body: the listing is
// reported as what it is, upstream_aborted, and not, five seconds on, as a
// listing whose response never came back through a missing ext_proc
// filter (capsnap_delivery_unbound_total, /readyz).
func TestUpstreamAbortedListing(t *testing.T) {
	s := deliveryStack(t, "", nil)
	unbound := faultMetric(t, s, "capsnap_delivery_unbound_total", "server_id", "billing")
	before := faultMetric(t, s, "capsnap_deliveries_total", "result", "upstream_aborted")
	// Reset a moment after the status and half the body went out, and at
	// once: then Envoy may end its ext_proc stream before it sends capsnap
	// anything, and capsnap knows the listing by the ticket Envoy opened
	// the stream with (grpc_service.initial_metadata).
	for _, how := range []string{"stall", "now"} {
		resp, body, err := agentRequest(&http.Client{Timeout: 10 * time.Second}, s, http.MethodPost, `{"jsonrpc":"2.0","id":41,"method":"tools/list"}`, map[string]string{abortHeader: how})
		if resp == nil {
			t.Logf("%s: the client got: %v", how, err)
			continue
		}
		t.Logf("%s: the client got status %d, %q (%v)", how, resp.StatusCode, body, err)
		if resp.StatusCode == http.StatusOK && len(body) > 0 && !bytes.Contains(body, []byte("capsnap")) {
			t.Fatalf("%s: part of the aborted answer reached the client: %q", how, body)
		}
	}
	waitMetric(t, s, "capsnap_deliveries_total", "result", "upstream_aborted", before+2)
	// Past the time a lost ticket is counted (decide's unboundAfter).
	time.Sleep(6500 * time.Millisecond)
	if got := faultMetric(t, s, "capsnap_delivery_unbound_total", "server_id", "billing"); got != unbound {
		t.Fatalf("capsnap_delivery_unbound_total went from %v to %v: the abort was taken for a missing response path", unbound, got)
	}
	if _, text := readyz(t, s, 0); strings.Contains(text, "never came back") {
		t.Fatalf("/readyz warns of a missing response path:\n%s", text)
	}
}
