//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/testbed"
)

// unboundWait bounds how long capsnap may take to count a listing whose
// response never came back: its 5 s, a sweep a second, and room for a
// loaded machine.
const unboundWait = 20 * time.Second

// withoutExtProc is envoy/demo.yaml for p without the response path's
// ext_proc filter: ext_authz alone, as an operator who added only the
// filter the README starts with would run it.
func withoutExtProc(t *testing.T, p testbed.Ports) []byte {
	t.Helper()
	cfg := string(testbed.EnvoyConfig(p))
	from := strings.Index(cfg, "          - name: capsnap.ext_proc\n")
	to := strings.Index(cfg, "          - name: envoy.filters.http.router\n")
	if from < 0 || to < from {
		t.Fatal("envoy config: the ext_proc filter is not where expected")
	}
	return []byte(cfg[:from] + cfg[to:])
}

// replicaMetric sums name's series of replica whose label has value want.
func replicaMetric(t *testing.T, s *testbed.Stack, replica int, name, label, want string) float64 {
	t.Helper()
	families := scrape(t, s.ReplicaAdminURL(replica))
	if _, ok := families[name]; !ok {
		t.Fatalf("replica %d exports no %s", replica, name)
	}
	return value(families, name, label, want)
}

// readyz is replica's GET /readyz.
func readyz(t *testing.T, s *testbed.Stack, replica int) (int, string) {
	t.Helper()
	resp, err := deliveryAdmin.Get(s.ReplicaAdminURL(replica) + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// skipOnBilling is envoy/demo.yaml for p with the ext_proc filter turned
// off on billing's route, as a route that "does not need it" might.
func skipOnBilling(t *testing.T, p testbed.Ports) []byte {
	t.Helper()
	cfg := string(testbed.EnvoyConfig(p))
	const route = "                      context_extensions: {server_id: billing}\n"
	if strings.Count(cfg, route) != 1 {
		t.Fatal("envoy config: billing's route is not where expected")
	}
	return []byte(strings.Replace(cfg, route, route+`                  capsnap.ext_proc:
                    "@type": type.googleapis.com/envoy.config.route.v3.FilterConfig
                    disabled: true
`, 1))
}

// Envoy runs ext_authz without capsnap's ext_proc filter, or skips it on
// billing's route: the agent gets the server's whole list and its calls
// are denied no_snapshot. capsnap notices that the listings it allowed
// never came back: it counts them, warns once for the server, says so on
// /readyz (still ready), and `capsnap check --envoy` refuses the
// bootstrap, naming the filter.
func TestResponsePathMissing(t *testing.T) {
	for _, tt := range []struct {
		name  string
		envoy func(*testing.T, testbed.Ports) []byte
		check string
		// status is what the agent's tools/list gets: the server's list,
		// unfiltered, or Envoy's 503 when the filter cannot reach capsnap.
		status int
	}{
		{"no ext_proc filter", withoutExtProc, "no ext_proc filter sends it responses", http.StatusOK},
		{"skipped on the route", skipOnBilling, `(server_id billing) disables the ext_proc filter "capsnap.ext_proc"`, http.StatusOK},
		{"ext_proc unreachable", deliveryExtProcUnreachable, "no ext_proc filter sends it responses", http.StatusServiceUnavailable},
	} {
		t.Run(tt.name, func(t *testing.T) { responsePathMissing(t, tt.envoy, tt.check, tt.status) })
	}
}

func responsePathMissing(t *testing.T, envoy func(*testing.T, testbed.Ports) []byte, check string, status int) {
	s := deliveryStack(t, "", func(o *testbed.StackOptions) { o.EnvoyYAML = envoy(t, o.Ports) })

	resp, body := deliveryRawList(t, s, 1, nil)
	if resp.StatusCode != status || resp.Header.Get(testbed.EpochHeader) != "" || (status == http.StatusOK) != strings.Contains(string(body), "wipe_ledger") {
		t.Fatalf("tools/list: %d, epoch %q, want %d and the server's own list only with 200\n%s", resp.StatusCode, resp.Header.Get(testbed.EpochHeader), status, body)
	}
	resp, body = postWith(t, s, deliveryAgent,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"lookup_order","arguments":{"order_id":"A-100"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`,
		map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "lookup_order"})
	switch r := resp.Header.Get("x-capsnap-reason"); {
	case status == http.StatusServiceUnavailable:
		// Every answer goes through ext_proc, capsnap's denials too: with
		// it unreachable, each fails closed.
		if resp.StatusCode != status {
			t.Fatalf("a call with ext_proc unreachable: %d, want %d\n%s", resp.StatusCode, status, body)
		}
	case r != "no_snapshot":
		t.Fatalf("a call after the unbound listing: reason %q, want no_snapshot\n%s", r, body)
	}
	deliveryRawList(t, s, 3, nil)

	deadline := time.Now().Add(unboundWait)
	for replicaMetric(t, s, 0, "capsnap_delivery_unbound_total", "server_id", "billing") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("capsnap_delivery_unbound_total{server_id=billing} = %v after %v, want 2",
				replicaMetric(t, s, 0, "capsnap_delivery_unbound_total", "server_id", "billing"), unboundWait)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := replicaMetric(t, s, 0, "capsnap_delivery_unbound_total", "server_id", "payments"); n != 0 {
		t.Errorf("payments, never listed: %v unbound", n)
	}

	code, ready := readyz(t, s, 0)
	if code != http.StatusOK || !strings.HasPrefix(ready, "ready\n") ||
		!strings.Contains(ready, "warning: server billing: 2 tools/list responses capsnap allowed never came back through the response path") ||
		strings.Contains(ready, "server payments") {
		t.Fatalf("/readyz %d:\n%s", code, ready)
	}

	var warned []string
	for _, line := range strings.Split(s.Capsnap.Output(), "\n") {
		var l struct {
			Level    string `json:"level"`
			Message  string `json:"message"`
			ServerID string `json:"server_id"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Level == "warn" && strings.Contains(l.Message, "never came back through the response path") {
			warned = append(warned, l.ServerID)
		}
	}
	if len(warned) != 1 || warned[0] != "billing" {
		t.Fatalf("warnings for %q, want one for billing", warned)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := deliveryCapsnap(ctx, "check", "--config", filepath.Join(s.Dir(), "capsnap.yaml"), "--envoy", filepath.Join(s.Dir(), "envoy.yaml"))
	// The one error is the missing response path: the rest of the
	// bootstrap the testbed writes is held to its capsnap and passes.
	if err == nil || !strings.Contains(string(out), check) || !strings.Contains(string(out), ": 1 error\n") {
		t.Fatalf("capsnap check --envoy: %v, want exit 1 naming one error: %s\n%s", err, check, out)
	}
}

// Two replicas share Redis: every listing's Check goes to one and its
// response to the other (testbed.StackOptions.CrossReplicas). Every
// response came back, so neither replica counts a listing unbound.
func TestResponsePathAcrossReplicas(t *testing.T) {
	s, _ := replicaStack(t, func(o *testbed.StackOptions) { o.CrossReplicas = true })
	const listings = 12
	for i := range listings {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`, 100+i)
		resp, got := postWith(t, s, supportAgent, body, map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"})
		if resp.StatusCode != http.StatusOK || resp.Header.Get(testbed.EpochHeader) == "" {
			t.Fatalf("listing %d: %d, epoch %q\n%s", i, resp.StatusCode, resp.Header.Get(testbed.EpochHeader), got)
		}
	}

	// Which replica decided each listing's Check, and which its response,
	// once both replicas' audit trails have written them.
	type halves struct{ check, response int }
	var byRequest map[string]*halves
	complete := func() bool {
		if len(byRequest) != listings {
			return false
		}
		for _, h := range byRequest {
			if h.check < 0 || h.response < 0 {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		byRequest = map[string]*halves{}
		audited(s, func(i int, phase, requestID string) {
			h := byRequest[requestID]
			if h == nil {
				h = &halves{-1, -1}
				byRequest[requestID] = h
			}
			if phase == "response" {
				h.response = i
			} else {
				h.check = i
			}
		})
		if complete() || time.Now().After(deadline) {
			break
		}
	}
	crossed := 0
	for id, h := range byRequest {
		if h.check < 0 || h.response < 0 {
			t.Fatalf("request %s: Check on replica %d, response on %d", id, h.check, h.response)
		}
		if h.check != h.response {
			crossed++
		}
	}
	if len(byRequest) != listings || crossed == 0 {
		t.Fatalf("%d listings audited, %d with Check and response on different replicas: the test shows nothing", len(byRequest), crossed)
	}
	t.Logf("%d of %d listings came back through the other replica", crossed, listings)

	// Past the 5 s in which a listing must come back, and a sweep.
	time.Sleep(8 * time.Second)
	for i := range 2 {
		if n := replicaMetric(t, s, i, "capsnap_delivery_unbound_total", "server_id", "billing"); n != 0 {
			t.Errorf("replica %d counts %v listings unbound, want 0", i, n)
		}
		if code, ready := readyz(t, s, i); code != http.StatusOK || strings.Contains(ready, "warning") {
			t.Errorf("replica %d /readyz %d:\n%s", i, code, ready)
		}
		if out := s.Replica(i).Output(); strings.Contains(out, "never came back through the response path") {
			t.Errorf("replica %d warned of a missing response path", i)
		}
	}
}

// audited calls each with the replica, phase and request id of every
// tools/list audit line both replicas wrote so far.
func audited(s *testbed.Stack, each func(replica int, phase, requestID string)) {
	for i := range 2 {
		for _, line := range strings.Split(s.Replica(i).Output(), "\n") {
			var a struct {
				Log       string `json:"log"`
				Phase     string `json:"phase"`
				MCPMethod string `json:"mcp_method"`
				RequestID string `json:"request_id"`
			}
			if json.Unmarshal([]byte(line), &a) == nil && a.Log == "audit" && a.MCPMethod == "tools/list" && a.RequestID != "" {
				each(i, a.Phase, a.RequestID)
			}
		}
	}
}
