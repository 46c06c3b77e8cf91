//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/testbed"
)

// TestTracing follows calls through the real Envoy into capsnap at a real
// OTLP receiver: each decision's span is in the trace of the request Envoy
// started, the child of Envoy's span for its call to capsnap, with the MCP
// attributes and the reason.
func TestTracing(t *testing.T) {
	c, err := testbed.StartCollector()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	s := deliveryStack(t, "", func(o *testbed.StackOptions) {
		o.EnvoyYAML = testbed.TracingEnvoyConfig(o.Ports, c.Port())
		o.Tracing = fmt.Sprintf("{endpoint: %q, insecure: true}", c.Addr())
	})
	deliveryRawList(t, s, 1, nil)
	for i, tool := range []string{"lookup_order", "wipe_ledger"} {
		postWith(t, s, deliveryAgent,
			fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":{"order_id":"A-100"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`, i+2, tool),
			map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": tool})
	}

	// Envoy and capsnap each export in batches, every few seconds.
	want := map[string]map[string]string{
		"tools/list":              {"capsnap.decision": "allow", "mcp.method.name": "tools/list"},
		"tools/list delivery":     {"capsnap.decision": "allow", "capsnap.tools_withheld": ""},
		"tools/call lookup_order": {"capsnap.decision": "allow", "gen_ai.tool.name": "lookup_order", "mcp.protocol.version": "2026-07-28"},
		"tools/call wipe_ledger":  {"capsnap.decision": "deny", "capsnap.reason": "tool_not_granted", "error.type": "tool_not_granted"},
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		missing := joined(c.Spans(), want)
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, sp := range c.Spans() {
				t.Logf("%s %q trace %s span %s parent %s %v", sp.Service, sp.Name, sp.TraceID, sp.SpanID, sp.ParentSpanID, sp.Attributes)
			}
			t.Fatalf("after 20s: %s", strings.Join(missing, "; "))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// joined says what is missing of want: for each capsnap span by name, with
// the attributes given (an empty value: any), whose parent is an Envoy span
// of the same trace, itself the child of another Envoy span.
func joined(spans []testbed.Span, want map[string]map[string]string) []string {
	envoy := map[string]testbed.Span{}
	for _, sp := range spans {
		if sp.Service == "envoy" {
			envoy[sp.SpanID] = sp
		}
	}
	var missing []string
	for name, attrs := range want {
		found := false
		for _, sp := range spans {
			if sp.Service != "capsnap" || sp.Name != name {
				continue
			}
			parent, ok := envoy[sp.ParentSpanID]
			grand, rooted := envoy[parent.ParentSpanID]
			if !ok || !rooted || parent.TraceID != sp.TraceID || grand.TraceID != sp.TraceID {
				continue
			}
			match := true
			for k, v := range attrs {
				got, has := sp.Attributes[k]
				match = match && (v == "" && has || got == v)
			}
			found = found || match
		}
		if !found {
			missing = append(missing, fmt.Sprintf("no capsnap span %q with %v under Envoy's", name, attrs))
		}
	}
	return missing
}
