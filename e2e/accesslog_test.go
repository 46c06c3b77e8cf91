//go:build e2e

package e2e

import (
	"bufio"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/testbed"
)

// mcpRow is what these tests read of a row of envoy/demo.yaml's access log.
type mcpRow struct {
	RequestID    string  `json:"request_id"`
	Method       string  `json:"method"`
	MCPMethod    *string `json:"mcp_method"`
	MCPName      *string `json:"mcp_name"`
	ResponseCode int     `json:"response_code"`
	Decision     *string `json:"decision"`
	Reason       *string `json:"reason"`
	Tool         *string `json:"tool"`
}

// mcpDecision is what these tests read of capsnap's audit line.
type mcpDecision struct {
	auditLine
	Version string `json:"protocol_version"`
	Phase   string `json:"phase"`
}

// Envoy's access log names the MCP method of every request, and the tool
// of every tools/call, allowed or denied, for the clients of every
// official SDK: those that speak 2025-11-25, which sends no Mcp-Method or
// Mcp-Name header, as well as those that speak 2026-07-28. The names are
// capsnap's, read from the body, and agree with its audit line.
func TestAccessLogNamesMCPRequests(t *testing.T) {
	kinds := sdkKinds(t)
	s := startStack(t)
	url := s.MCPURL()
	// The kinds whose version the issue is about: before this, their rows
	// had mcp_method and mcp_name null.
	want1125 := []string{"go-2025-11-25", "typescript", "python"}
	type span struct {
		kind     string
		from, to int // capsnap's audit lines of the kind's steps
	}
	var spans []span
	for _, kind := range kinds {
		from := len(mcpDecisions(t, s))
		support, st := sdkConnect(t, kind, url, supportAgent)
		if !st.OK {
			t.Fatalf("[%s] connect: %s", kind.name, st.summary())
		}
		if slices.Contains(want1125, kind.name) && st.ProtocolVersion != "2025-11-25" {
			t.Fatalf("[%s] connected at %q, want 2025-11-25", kind.name, st.ProtocolVersion)
		}
		if got := support.list(t); !slices.Contains(got, "refund") {
			t.Fatalf("[%s] delivered %v, want refund among them", kind.name, got)
		}
		support.mustAllow(t, "refund", refundA100)
		readonly := sdkMustConnect(t, kind, url, readonlyAgent)
		readonly.list(t)
		readonly.mustDeny(t, "refund", refundA100, "tool_not_granted")
		spans = append(spans, span{kind.name, from, lastDenial(t, s, from) + 1})
	}

	// Stopped, Envoy has flushed its access log.
	if err := s.Envoy.Stop(); err != nil {
		t.Fatalf("stop envoy: %v", err)
	}
	rows := map[string]mcpRow{}
	sc := bufio.NewScanner(strings.NewReader(s.Envoy.Output()))
	for sc.Scan() {
		var r mcpRow
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.RequestID != "" {
			rows[r.RequestID] = r
		}
	}
	str := func(p *string) string {
		if p == nil {
			return "<null>"
		}
		return *p
	}
	audit := mcpDecisions(t, s)
	for _, sp := range spans {
		t.Run(sp.kind, func(t *testing.T) {
			var allowed, denied, listed int
			for _, a := range audit[sp.from:sp.to] {
				if a.Phase != "" {
					continue // a tools/list response's decision: its request has its own line
				}
				r, ok := rows[a.RequestID]
				if !ok {
					// A GET stream still open when Envoy stopped may have
					// no row; every POST has one.
					if a.Method != "GET" {
						t.Errorf("no access log row for request %s (%+v)", a.RequestID, a)
					}
					continue
				}
				// Every row names what capsnap decided on.
				wantMethod, wantName := a.Method, "<null>"
				if wantMethod == "" {
					wantMethod = "<null>"
				}
				if a.Method == "tools/call" {
					wantName = a.Tool
				}
				if str(r.MCPMethod) != wantMethod || str(r.MCPName) != wantName {
					t.Errorf("request %s (%s): access log names %s %s, capsnap decided on %s %s", a.RequestID, r.Method, str(r.MCPMethod), str(r.MCPName), wantMethod, wantName)
				}
				if a.Method != "tools/call" && a.Method != "tools/list" {
					continue
				}
				if slices.Contains(want1125, sp.kind) && a.Version != "2025-11-25" {
					t.Errorf("request %s: %s at protocol version %q, want 2025-11-25", a.RequestID, a.Method, a.Version)
				}
				switch {
				case a.Method == "tools/list" && str(r.Decision) == "allow" && r.ResponseCode == http.StatusOK:
					listed++
				case a.Method == "tools/call" && a.Tool == "refund" && str(r.Decision) == "allow" && r.ResponseCode == http.StatusOK:
					allowed++
				case a.Method == "tools/call" && a.Tool == "refund" && str(r.Decision) == "deny" && str(r.Reason) == "tool_not_granted":
					denied++
				default:
					t.Errorf("request %s: row %+v for %+v", a.RequestID, r, a)
				}
			}
			if listed != 2 || allowed != 1 || denied != 1 {
				t.Errorf("rows: %d tools/list, %d allowed and %d denied refund calls; want 2, 1 and 1", listed, allowed, denied)
			}
		})
	}
}

// mcpDecisions are capsnap's audit lines so far, in order.
func mcpDecisions(t *testing.T, s *testbed.Stack) []mcpDecision {
	t.Helper()
	var out []mcpDecision
	for _, line := range strings.Split(s.Capsnap.Output(), "\n") {
		var a mcpDecision
		if json.Unmarshal([]byte(line), &a) == nil && a.Decision != "" {
			out = append(out, a)
		}
	}
	return out
}

// lastDenial waits for capsnap's audit line of a tool_not_granted denial
// at or after index from, and returns its index: every earlier step's line
// is before it.
func lastDenial(t *testing.T, s *testbed.Stack, from int) int {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for {
		a := mcpDecisions(t, s)
		for i := len(a) - 1; i >= from; i-- {
			if a[i].Reason == "tool_not_granted" {
				return i
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("capsnap's audit line of the denial did not arrive; last: %+v", a[max(0, len(a)-3):])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
