package decide

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/deny"
)

// observeBilling puts billing in config.ModeObserve; payments enforces.
func observeBilling(o *Options) { o.Observe = []string{"billing"} }

// auditLines are the audit lines of f so far, decoded.
func auditLines(t *testing.T, f *fixture) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(f.audit.Bytes()), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("audit line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	return lines
}

// On an observed server a request that would be denied passes with no pin,
// and is audited and counted as the denial it would have been; on any
// other server it is denied.
func TestObserveLetsDenialsPass(t *testing.T) {
	f := newFixture(t, observeBilling)
	forged := map[string]string{HeaderTool: "refund", HeaderEpoch: "ep_forged"}

	resp, err := f.Check(context.Background(), checkCase{Principal: support, Headers: forged, Body: callBody("refund")}.request())
	if err != nil {
		t.Fatal(err)
	}
	ok := resp.GetOkResponse()
	if ok == nil {
		t.Fatalf("an observed no_snapshot was enforced: %s", resp.GetDeniedResponse().GetBody())
	}
	if len(ok.GetHeaders()) != 0 {
		t.Errorf("an observed denial carries pins to the upstream: %v", ok.GetHeaders())
	}
	if removed := strings.Join(ok.GetHeadersToRemove(), ","); !strings.Contains(removed, HeaderTool) || !strings.Contains(removed, HeaderEpoch) {
		t.Errorf("the client's x-capsnap-* headers are not removed: %q", removed)
	}
	md := onTheWire(t, resp).GetDynamicMetadata().GetFields()
	if md["decision"].GetStringValue() != "allow" || md["reason"].GetStringValue() != string(deny.NoSnapshot) || md["enforced"].GetStringValue() != "false" {
		t.Errorf("metadata %v, want an allow for reason no_snapshot, not enforced", md)
	}
	line := auditLines(t, f)[0]
	if line["decision"] != "deny" || line["reason"] != string(deny.NoSnapshot) || line["enforced"] != false {
		t.Errorf("audit line %v, want the denial, not enforced", line)
	}
	if got := testutil.ToFloat64(f.metrics.decisions.WithLabelValues("deny", "no_snapshot", "billing", "none", "observe")); got != 1 {
		t.Errorf("observed denials counted %v, want 1", got)
	}

	// Payments enforces.
	if o := f.call(t, checkCase{Principal: support, ServerID: "payments", Body: paymentsRefund}); o.reason != deny.NoSnapshot {
		t.Errorf("payments answered %+v, want no_snapshot enforced", o)
	}
	if got := testutil.ToFloat64(f.metrics.decisions.WithLabelValues("deny", "no_snapshot", "payments", "none", "enforce")); got != 1 {
		t.Errorf("enforced denials counted %v, want 1", got)
	}

	// An allowed call on an observed server is pinned as ever.
	f.list(t, support, "billing", nil)
	if o := f.call(t, checkCase{Principal: support, Body: callBody("refund")}); o.upstream[HeaderTool] != "refund" || o.upstream[HeaderEpoch] == "" {
		t.Errorf("an allowed call in observe mode lost its pins: %+v", o)
	}
}

// On an observed server a listing reaches the agent as the server sent it,
// with the epoch of the snapshot minted over what it would have been
// delivered; what would have been withheld is audited and counted.
func TestObserveDeliversTheServersListing(t *testing.T) {
	f := deliveryFixture(t, "", observeBilling)
	body := listResponse(`"l"`, "", defLookupOdd, defExport)
	out := f.Deliver(f.ticket(t, support, listBody), okJSON, body)
	if out.Fail != nil || out.Body != nil {
		t.Fatalf("observed listing changed: fail %v, body %s", out.Fail, out.Body)
	}
	if got := withheldOf(out); len(got) != 1 || got[0].tool != "export_ledger" || got[0].reason != deny.ToolNotGranted {
		t.Errorf("withheld %v, want export_ledger not granted", got)
	}
	epoch := deliveredHeader(out, HeaderEpoch)
	snap, ok, _ := f.snapshots.ByEpoch(epoch)
	if !ok || len(snap.Pins) != 1 {
		t.Fatalf("snapshot %q: %v, want one pin (lookup_order)", epoch, snap)
	}
	last := auditLines(t, f)
	if line := last[len(last)-1]; line["phase"] != "response" || line["enforced"] != false || line["withheld"] == nil {
		t.Errorf("delivery audit line %v, want what was withheld, not enforced", line)
	}

	// A listing capsnap would refuse passes too.
	out = f.Deliver(f.ticket(t, support, listBody), okJSON, []byte(`{"jsonrpc":"2.0","id":"l","result":{"tools":[]},"result":{}}`))
	if out.Fail != nil || out.Body != nil || len(out.Headers) != 0 {
		t.Errorf("an observed malformed_response was enforced: %+v", out)
	}
	if got := testutil.ToFloat64(f.metrics.deliveries.WithLabelValues("billing", string(deny.MalformedResponse))); got != 1 {
		t.Errorf("observed refusals counted %v, want 1", got)
	}
}

// On an observed server a listing on another stream passes, counted.
func TestObserveScreen(t *testing.T) {
	f := newFixture(t, observeBilling)
	listing := []byte(`{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"ghost","inputSchema":{"type":"object"}}]}}`)
	for _, tt := range []struct {
		server  string
		changed bool
	}{{"billing", false}, {"payments", true}} {
		got := f.Screen(tt.server, okJSON, listing).Content
		if changed := !bytes.Equal(got, listing); changed != tt.changed {
			t.Errorf("%s: changed %v, want %v: %s", tt.server, changed, tt.changed, got)
		}
		if n := testutil.ToFloat64(f.metrics.deliveries.WithLabelValues(tt.server, string(deny.ListingUnbound))); n != 1 {
			t.Errorf("%s: %v listing_unbound counted, want 1", tt.server, n)
		}
	}
}

// A server named for observe mode must be one capsnap guards.
func TestObserveUnknownServer(t *testing.T) {
	o := Options{Observe: []string{"nowhere"}}
	f := newFixture(t)
	o.Catalog, o.Rules, o.Snapshots, o.SnapshotTTL, o.Freshness, o.Servers = f.catalog, f.rules.Load(), f.snapshots, f.ttl, f.freshness, []string{"billing"}
	if _, err := New(o); err == nil || !strings.Contains(err.Error(), `"nowhere"`) {
		t.Errorf("New = %v, want an error naming the unknown server", err)
	}
}

// In observe mode a call the approval rule holds is decided
// approval_required, audited, and let through; no request is opened, so
// nobody is paged to approve a call that already ran.
func TestObserveOpensNoApprovalRequest(t *testing.T) {
	var svc *approval.Service
	f := newFixture(t, observeBilling, func(o *Options) {
		o.Rules = mustRules(t, "testdata/approval/policy.yaml")
		svc = serveApprovals(t, o)
	})
	f.billing.push(t, "testdata/pack/catalog.json", nil)
	f.list(t, support, "billing", nil)
	resp, err := f.Check(context.Background(), refundOf(150).request())
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOkResponse() == nil {
		t.Fatalf("an observed approval was enforced: %s", resp.GetDeniedResponse().GetBody())
	}
	lines := auditLines(t, f)
	if last := lines[len(lines)-1]; last["reason"] != string(deny.ApprovalRequired) || last["enforced"] != false {
		t.Errorf("audit line %v, want approval_required, not enforced", last)
	}
	if all, _ := svc.List(approval.Filter{}); len(all) != 0 {
		t.Fatalf("observe mode opened %d approval requests", len(all))
	}
}
