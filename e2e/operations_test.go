//go:build e2e

package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/capsnap/capsnap/examples/billing"
	"github.com/capsnap/capsnap/testbed"
)

// After the end-to-end scenario, the scraped metrics agree with the
// decisions made, and every audit line parses and carries the snapshot it
// was decided under.
func TestMetricsAndAuditAgree(t *testing.T) {
	s := startStack(t)
	c := connect(t, s, "billing", supportAgent, "2025-11-25")
	epoch := c.list(t)
	want := map[string]int{}
	expect := func(reason string) {
		if reason == "" {
			reason = "ok"
		}
		want[reason]++
	}
	expect(c.call(t, "refund", refundA100))
	expect(c.call(t, "delete_all_orders", map[string]any{}))
	redeploy(t, s, "billing", billing.SkipFraudCheck)
	c.agent.Send(testbed.EpochHeader, epoch)
	if r := c.call(t, "refund", refundA100); r != "schema_drift" {
		t.Fatalf("drift: %q", r)
	}
	expect("schema_drift")

	// Audit: every line is JSON; every tools/call line names its epoch.
	calls := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(s.Capsnap.Output()), "\n") {
		if !strings.Contains(line, `"log":"audit"`) {
			continue
		}
		var a map[string]any
		if err := json.Unmarshal([]byte(line), &a); err != nil {
			t.Fatalf("audit line does not parse: %v: %s", err, line)
		}
		for _, k := range []string{"time", "decision", "reason", "request_id", "principal", "server_id", "latency_us"} {
			if _, ok := a[k]; !ok {
				t.Errorf("audit line lacks %s: %s", k, line)
			}
		}
		if a["mcp_method"] == "tools/call" {
			calls[a["reason"].(string)]++
			if a["reason"] != "unknown_tool" && a["epoch"] != epoch {
				t.Errorf("tools/call audit line under epoch %v, want %s: %s", a["epoch"], epoch, line)
			}
			if a["arguments_digest"] == nil {
				t.Errorf("tools/call audit line has no arguments_digest: %s", line)
			}
			if strings.Contains(line, "A-100") {
				t.Errorf("audit line carries the arguments themselves: %s", line)
			}
		}
	}
	for reason, n := range want {
		if calls[reason] != n {
			t.Errorf("audit has %d tools/call lines with reason %s, want %d", calls[reason], reason, n)
		}
	}

	// Metrics: the decision counters agree with the audit trail.
	families := scrape(t, s.AdminURL())
	// A Check's line is counted in decisions_total, a tools/list
	// response's (phase "response") in deliveries_total.
	audited, delivered := map[string]int{}, map[string]int{}
	for _, line := range strings.Split(s.Capsnap.Output(), "\n") {
		var a struct{ Log, Reason, Phase string }
		switch {
		case json.Unmarshal([]byte(line), &a) != nil || a.Log != "audit":
		case a.Phase == "response":
			delivered[a.Reason]++
		default:
			audited[a.Reason]++
		}
	}
	if delivered["ok"] == 0 {
		t.Error("no tools/list response was audited")
	}
	for _, m := range families["capsnap_deliveries_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			// One for each answer that is not a listing's own, and not
			// audited: a line for every call's answer says nothing.
			if l.GetName() == "result" && l.GetValue() != "screened" && l.GetValue() != "unfinished" {
				delivered[l.GetValue()] -= int(m.GetCounter().GetValue())
			}
		}
	}
	for result, n := range delivered {
		if n != 0 {
			t.Errorf("capsnap_deliveries_total{result=%q} and the audit trail differ by %d", result, n)
		}
	}
	counted := map[string]int{}
	for _, m := range families["capsnap_decisions_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "reason" {
				counted[l.GetValue()] += int(m.GetCounter().GetValue())
			}
		}
	}
	for reason, n := range audited {
		if counted[reason] != n {
			t.Errorf("capsnap_decisions_total{reason=%q} = %d, audit has %d", reason, counted[reason], n)
		}
	}
	for _, name := range []string{"capsnap_snapshots_minted_total", "capsnap_snapshots_active", "capsnap_snapshot_invalidations_total",
		"capsnap_catalog_tools", "capsnap_catalog_refreshes_total", "capsnap_catalog_list_changed_total",
		"capsnap_catalog_staleness_seconds", "capsnap_policy_info", "capsnap_snapshot_lookups_total", "capsnap_check_duration_seconds", "capsnap_deliveries_total"} {
		if families[name] == nil {
			t.Errorf("metric %s is not exported", name)
		}
	}
	if v := value(families, "capsnap_catalog_list_changed_total", "server_id", "billing"); v < 1 {
		t.Errorf("list_changed from billing counted %v times, want at least 1", v)
	}
	if v := value(families, "capsnap_snapshot_invalidations_total", "server_id", "billing"); v < 1 {
		t.Errorf("invalidations on billing: %v, want at least 1 (refund changed)", v)
	}
}

func value(families map[string]*dto.MetricFamily, name, label, want string) float64 {
	var sum float64
	for _, m := range families[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == want {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
