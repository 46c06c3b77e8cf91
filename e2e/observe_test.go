//go:build e2e

package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/testbed"
)

// TestObserveMode runs capsnap in observe mode behind the real Envoy: the
// agent gets the server's whole list and calls a tool no one is granted,
// and the server runs it; capsnap audits, counts and reports the denials it
// did not enforce.
func TestObserveMode(t *testing.T) {
	s := deliveryStack(t, "", func(o *testbed.StackOptions) { o.Mode = "observe" })

	resp, body := deliveryRawList(t, s, 1, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"wipe_ledger"`) || resp.Header.Get(testbed.EpochHeader) == "" {
		t.Fatalf("tools/list: %d, epoch %q, want 200 with the server's whole list and an epoch\n%s",
			resp.StatusCode, resp.Header.Get(testbed.EpochHeader), body)
	}
	resp, body = postWith(t, s, deliveryAgent,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wipe_ledger","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`,
		map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "wipe_ledger"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get("x-capsnap-reason") != "" || !strings.Contains(string(body), `"result"`) {
		t.Fatalf("an ungranted call in observe mode: %d, reason %q, want the server's result\n%s",
			resp.StatusCode, resp.Header.Get("x-capsnap-reason"), body)
	}

	// Both Checks, the listing's and the call's.
	if n := replicaMetric(t, s, 0, "capsnap_decisions_total", "mode", "observe"); n != 2 {
		t.Errorf("capsnap_decisions_total{mode=observe} = %v, want 2", n)
	}
	if n := replicaMetric(t, s, 0, "capsnap_decisions_total", "mode", "enforce"); n != 0 {
		t.Errorf("capsnap_decisions_total{mode=enforce} = %v, want none", n)
	}
	var notEnforced, warned bool
	for _, line := range strings.Split(s.Capsnap.Output(), "\n") {
		if strings.Contains(line, `"tool":"wipe_ledger"`) && strings.Contains(line, `"decision":"deny"`) && strings.Contains(line, `"enforced":false`) {
			notEnforced = true
		}
		if strings.Contains(line, "OBSERVE MODE") && strings.Contains(line, `"level":"warn"`) {
			warned = true
		}
	}
	if !notEnforced || !warned {
		t.Errorf("capsnap's output: the call's denial audited as not enforced %v, the startup warning %v\n%s", notEnforced, warned, s.Capsnap.Output())
	}
	if code, ready := readyz(t, s, 0); code != http.StatusOK || !strings.Contains(ready, "warning: server billing is in observe mode") {
		t.Errorf("/readyz %d:\n%s", code, ready)
	}
}
