//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/capsnap/capsnap/testbed"
	"github.com/capsnap/capsnap/testbed/browser"
)

// TestApprovalInBrowser is the whole loop through the real Envoy and a
// real headless Chromium: a refund over USD 100 is denied
// approval_required; the on-call opens the URL from the denial, sees the
// exact arguments and approves; the agent's identical retry runs, a
// second retry and a changed amount are each denied again. Screenshots of
// the page are kept in $CAPSNAP_ARTIFACTS/e2e-approval.
func TestApprovalInBrowser(t *testing.T) {
	b := browser.Start(t, "e2e-approval", true)
	s := startStackWith(t, func(o *testbed.StackOptions) { o.Policy, o.Approvals = []byte(approvalPolicy), true })
	const agent = "spiffe://acme/agent/browser"
	deliveryRawListAs(t, s, agent)
	refund := func(id int, amount float64) (reason, approvalURL string, body []byte) {
		t.Helper()
		_, body = postWith(t, s, agent, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"refund","arguments":{"order_id":"A-<b>100</b>","amount":%v,"reason_code":"damaged"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`, id, amount),
			map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "refund"})
		var r struct {
			Error struct {
				Data struct {
					Reason   string `json:"reason"`
					Approval struct {
						URL string `json:"url"`
					} `json:"approval"`
				} `json:"data"`
			} `json:"error"`
		}
		doc := body
		// An answer the server streams carries its message in a data line.
		if _, data, ok := strings.Cut(string(body), "data: "); ok {
			doc = []byte(strings.TrimSpace(data))
		}
		if err := json.Unmarshal(doc, &r); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return r.Error.Data.Reason, r.Error.Data.Approval.URL, body
	}
	reason, link, body := refund(2, 150)
	if reason != "approval_required" || !strings.HasPrefix(link, s.ApprovalsURL()+"/approvals/") {
		t.Fatalf("a refund of 150: %s", body)
	}

	ctx, shot := b.Ctx, func(name string) { b.Screenshot(t, name) }
	if err := chromedp.Do(ctx, chromedp.Navigate(link+"?token="+url.QueryEscape(testbed.ApproverToken)), chromedp.WaitVisible(chromedp.ID("approve"))); err != nil {
		t.Fatalf("open %s: %v", link, err)
	}
	shot("1-pending.png")
	args, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("arguments")))
	if err != nil || !strings.Contains(args, `"amount": 150`) || !strings.Contains(args, "A-<b>100</b>") {
		t.Fatalf("the page shows the arguments %q (%v)", args, err)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("approve")), chromedp.WaitVisible(chromedp.ID("outcome"))); err != nil {
		t.Fatalf("approve: %v", err)
	}
	shot("2-approved.png")

	if reason, _, body := refund(3, 150); reason != "" || !strings.Contains(string(body), "Refund rf_") {
		t.Fatalf("the approved refund: %s", body)
	}
	if reason, _, body := refund(4, 150); reason != "approval_required" {
		t.Fatalf("the approved refund a second time: %s", body)
	}
	if reason, _, body := refund(5, 151); reason != "approval_required" {
		t.Fatalf("a refund of 151 after approving 150: %s", body)
	}
}
