package decide

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/capsnap/capsnap/approval"
)

// anID is an approval or review id in a body, which NewID makes at random.
var anID = regexp.MustCompile(`(approvals/|"id":")[A-Za-z0-9_-]{22}`)

// The exact bodies an agent gets for the denials of a held call and of a
// changed tool, as JSON-RPC errors (denials.status ok), kept under
// testdata/golden/body_*.json with each random id as <id>: what
// docs/APPROVALS.md and docs/DENIALS.md show.
func TestHeldAndChangedBodiesGolden(t *testing.T) {
	var svc *approval.Service
	f := newFixture(t, func(o *Options) {
		o.Rules = mustRules(t, "testdata/approval/policy.yaml")
		svc = serveApprovals(t, o, func(c *approval.Config) { c.DeniedFor, c.MaxNew, c.Window = time.Hour, 2, time.Hour })
	})
	f.billing.push(t, "testdata/pack/catalog.json", nil)
	f.list(t, support, "billing", nil)
	body := func(c checkCase) []byte {
		t.Helper()
		resp, err := f.Check(t.Context(), c.request())
		if err != nil {
			t.Fatal(err)
		}
		return anID.ReplaceAll([]byte(onTheWire(t, resp).GetDeniedResponse().GetBody()+"\n"), []byte("${1}<id>"))
	}
	bodies := map[string][]byte{}
	held := refundOf(150)
	bodies["approval_required"] = body(held)
	held2026 := checkCase{Principal: support, Headers: map[string]string{"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "refund"},
		Body: `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"refund","arguments":{"order_id":"A-100","amount":149,"reason_code":"damaged"},` +
			`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}}}}}`}
	f.list(t, support, "billing", map[string]string{"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"})
	bodies["input_required_2026"] = body(held2026)
	o := f.call(t, held)
	if _, err := svc.Decide(o.data.Approval.ID, approval.Approver{ID: "bob@acme.example", Groups: []string{"oncall"}}, false, "order A-100 was refunded yesterday"); err != nil {
		t.Fatal(err)
	}
	bodies["approval_denied"] = body(held)
	bodies["approval_requests_limited"] = body(refundOf(152))

	c, _ := changesFixture(t, "policy.yaml")
	c.listed(t)
	c.redeploy(t, "testdata/changes/catalog-skip.json")
	bodies["schema_drift_change"] = anID.ReplaceAll(func() []byte {
		resp, err := c.Check(t.Context(), refundOf(40).request())
		if err != nil {
			t.Fatal(err)
		}
		return []byte(onTheWire(t, resp).GetDeniedResponse().GetBody() + "\n")
	}(), []byte("${1}<id>"))
	c.listed(t)
	resp, err := c.Check(t.Context(), refundOf(40).request())
	if err != nil {
		t.Fatal(err)
	}
	bodies["tool_under_review"] = anID.ReplaceAll([]byte(onTheWire(t, resp).GetDeniedResponse().GetBody()+"\n"), []byte("${1}<id>"))

	for name, got := range bodies {
		path := filepath.Join("testdata", "golden", "body_"+name+".json")
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -update to create it)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s:\ngot  %s\nwant %s", name, path, got, want)
		}
	}
}
