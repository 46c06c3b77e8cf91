package decide

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/deny"
)

// approvalFixture is the pack's billing catalog under testdata/approval's
// policy, with an approval service on a memory store.
func approvalFixture(t *testing.T) (*fixture, *approval.Service) {
	t.Helper()
	var svc *approval.Service
	f := newFixture(t, func(o *Options) {
		o.Rules = mustRules(t, "testdata/approval/policy.yaml")
		svc = serveApprovals(t, o)
	})
	f.billing.push(t, "testdata/pack/catalog.json", nil)
	f.list(t, support, "billing", nil)
	return f, svc
}

// serveApprovals gives o an approval service on a memory store, on o's
// clock, at https://approve.example, as edit says.
func serveApprovals(t *testing.T, o *Options, edit ...func(*approval.Config)) *approval.Service {
	t.Helper()
	c := approval.Config{Store: approval.NewMemory(time.Hour), BaseURL: "https://approve.example", Now: o.Now}
	for _, e := range edit {
		e(&c)
	}
	svc, err := approval.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	o.Approvals = svc
	return svc
}

// The identical call runs once after a person approves it; again, or with
// other arguments, it needs another approval; under the condition it needs
// none.
func TestApprovalBindsTheExactCall(t *testing.T) {
	f, svc := approvalFixture(t)
	if o := f.call(t, refundOf(40)); o.reason != "" {
		t.Fatalf("a refund under the condition: %q", o.reason)
	}
	o := f.call(t, refundOf(150))
	if o.reason != deny.ApprovalRequired || o.data.Approval == nil || o.data.ReturnTo != "approval" {
		t.Fatalf("a refund of 150 unapproved: %+v", o)
	}
	a := o.data.Approval
	if a.URL != "https://approve.example/approvals/"+a.ID || a.ExpiresAt.IsZero() {
		t.Fatalf("data.approval %+v", a)
	}
	// Asked again before anyone decides, the same request.
	if again := f.call(t, refundOf(150)); again.data.Approval == nil || again.data.Approval.ID != a.ID {
		t.Fatalf("a retry opened another request: %+v", again.data.Approval)
	}
	if _, err := svc.Decide(a.ID, approval.Approver{ID: "mallory@acme.example"}, true, ""); err == nil {
		t.Fatal("an approver outside the rule approved")
	}
	if _, err := svc.Decide(a.ID, approval.Approver{ID: "bob@acme.example", Groups: []string{"oncall"}}, true, "ok"); err != nil {
		t.Fatal(err)
	}
	if o := f.call(t, refundOf(151)); o.reason != deny.ApprovalRequired || o.data.Approval.ID == a.ID {
		t.Fatalf("other arguments: %q %+v", o.reason, o.data.Approval)
	}
	if o := f.call(t, refundOf(150)); o.reason != "" {
		t.Fatalf("the approved call: %q %s", o.reason, o.data.Detail)
	}
	if o := f.call(t, refundOf(150)); o.reason != deny.ApprovalRequired || o.data.Approval.ID == a.ID {
		t.Fatalf("the approved call a second time: %q %+v", o.reason, o.data.Approval)
	}
}

// A client that declared URL-mode elicitation gets MCP's
// URLElicitationRequiredError in 2025-11-25, once the initialize whose
// answer named its session declared it.
func TestApprovalAsURLElicitation(t *testing.T) {
	f, _ := approvalFixture(t)
	elicitation := func(t *testing.T, c checkCase) (code int, url string) {
		t.Helper()
		resp, err := f.Check(context.Background(), c.request())
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Error struct {
				Code int `json:"code"`
				Data struct {
					Elicitations []struct{ Mode, ElicitationID, URL string } `json:"elicitations"`
				} `json:"data"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(resp.GetDeniedResponse().GetBody()), &body); err != nil {
			t.Fatalf("%v: %v", resp, err)
		}
		if len(body.Error.Data.Elicitations) == 1 {
			url = body.Error.Data.Elicitations[0].URL
		}
		return body.Error.Code, url
	}
	// 2026-07-28: the call itself declares it, and is answered with an
	// InputRequiredResult (TestInputRequiredResult).

	// 2025-11-25: the session is named by the initialize's answer.
	init := checkCase{Principal: support, Headers: map[string]string{"mcp-protocol-version": "2025-11-25"},
		Body: `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{"form":{},"url":{}}},"clientInfo":{"name":"a","version":"1"}}}`}
	resp, err := f.Check(context.Background(), init.request())
	if err != nil {
		t.Fatal(err)
	}
	if md := onTheWire(t, resp).GetDynamicMetadata().GetFields(); md["elicitation"].GetStringValue() != "url" {
		t.Fatalf("initialize's metadata %v, want elicitation url", md)
	}
	session := map[string]string{"mcp-protocol-version": "2025-11-25", "mcp-session-id": "S-1"}
	f.list(t, support, "billing", session)
	call1125 := refundOf(150)
	call1125.Headers = session
	if code, url := elicitation(t, call1125); code != CodeDenied || url != "" {
		t.Fatalf("before the session was named: code %d, url %q: want capsnap's own error", code, url)
	}
	f.Elicits("S-1")
	if code, url := elicitation(t, call1125); code != CodeURLElicitationRequired || url == "" {
		t.Fatalf("a session that declared url elicitation: code %d, url %q", code, url)
	}
}

// A 2026-07-28 client that declares URL-mode elicitation on the call gets
// the approval as 2026-07-28 has it: a result, InputRequiredResult, with
// one URL-mode elicitation/create, the approval page, and no
// requestState. Its retry (a new id, inputResponses under capsnap's key)
// is the same call: held while undecided, run once approved, and no more.
// A client that declared no URL elicitation gets capsnap's own error.
func TestInputRequiredResult(t *testing.T) {
	f, svc := approvalFixture(t)
	const caps = `"io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}}`
	call := func(id int, meta, extra string) checkCase {
		return checkCase{Principal: support, Headers: map[string]string{"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "refund"},
			Body: fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"refund","arguments":{"order_id":"A-100","amount":150,"reason_code":"damaged"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"%s}%s}}`, id, meta, extra)}
	}
	answer := func(c checkCase) (status int, body map[string]any) {
		t.Helper()
		resp, err := f.Check(context.Background(), c.request())
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOkResponse() != nil {
			return 0, nil
		}
		d := resp.GetDeniedResponse()
		if err := json.Unmarshal([]byte(d.GetBody()), &body); err != nil {
			t.Fatal(err)
		}
		return int(d.GetStatus().GetCode()), body
	}
	f.list(t, support, "billing", map[string]string{"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"})
	status, body := answer(call(5, ","+caps, ""))
	result, _ := body["result"].(map[string]any)
	reqs, _ := result["inputRequests"].(map[string]any)
	approvalReq, _ := reqs[InputRequestApproval].(map[string]any)
	params, _ := approvalReq["params"].(map[string]any)
	url, _ := params["url"].(string)
	if status != 200 || body["id"] != float64(5) || result["resultType"] != "input_required" || len(reqs) != 1 ||
		approvalReq["method"] != "elicitation/create" || params["mode"] != "url" || !strings.HasPrefix(url, "https://approve.example/approvals/") {
		t.Fatalf("the held call: %d %v", status, body)
	}
	if _, ok := result["requestState"]; ok {
		t.Fatalf("capsnap minted a requestState: %v", result)
	}
	if _, ok := body["error"]; ok {
		t.Fatalf("an InputRequiredResult with an error: %v", body)
	}

	retry := call(6, ","+caps, `,"inputResponses":{"`+InputRequestApproval+`":{"action":"accept"}}`)
	if status, body := answer(retry); status != 200 || body["result"].(map[string]any)["resultType"] != "input_required" {
		t.Fatalf("the retry before anyone decided: %d %v", status, body)
	}
	id := strings.TrimPrefix(url, "https://approve.example/approvals/")
	if _, err := svc.Decide(id, approval.Approver{ID: "bob@acme.example", Groups: []string{"oncall"}}, true, "ok"); err != nil {
		t.Fatal(err)
	}
	if status, body := answer(call(7, ","+caps, `,"inputResponses":{"`+InputRequestApproval+`":{"action":"accept"}}`)); status != 0 {
		t.Fatalf("the approved retry: %d %v", status, body)
	}
	if status, body := answer(call(8, ","+caps, `,"inputResponses":{"`+InputRequestApproval+`":{"action":"accept"}}`)); status != 200 || body["result"] == nil {
		t.Fatalf("a second retry ran: %d %v", status, body)
	}

	// The user declined (or cancelled) the elicitation: the approval as an
	// error, which ends the client's retries.
	status, body = answer(call(10, ","+caps, `,"inputResponses":{"`+InputRequestApproval+`":{"action":"decline"}}`))
	if e, _ := body["error"].(map[string]any); status != 200 || e == nil || e["code"] != float64(CodeDenied) {
		t.Fatalf("the declined retry: %d %v", status, body)
	}

	// No URL elicitation declared: capsnap's own error, data.approval.
	status, body = answer(call(9, "", ""))
	e, _ := body["error"].(map[string]any)
	if status != 200 || e["code"] != float64(CodeDenied) || e["data"].(map[string]any)["approval"] == nil {
		t.Fatalf("without url elicitation: %d %v", status, body)
	}
}

// downStore is an approvals store that cannot answer.
type downStore struct{ *approval.Memory }

func (downStore) Consume(approval.Binding, time.Time) (approval.Request, bool, error) {
	return approval.Request{}, false, errors.New("approvals store down")
}

// With the approvals store down, a call held for approval is denied
// store_unavailable, never allowed; a call the rule does not hold is
// unaffected.
func TestApprovalStoreDown(t *testing.T) {
	f := newFixture(t, func(o *Options) {
		o.Rules = mustRules(t, "testdata/approval/policy.yaml")
		svc, err := approval.New(approval.Config{Store: downStore{approval.NewMemory(time.Hour)}, BaseURL: "https://approve.example", Now: o.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(svc.Close)
		o.Approvals = svc
	})
	f.billing.push(t, "testdata/pack/catalog.json", nil)
	f.list(t, support, "billing", nil)
	if o := f.call(t, refundOf(150)); o.reason != deny.StoreUnavailable {
		t.Errorf("a held call with the approvals store down: %q", o.reason)
	}
	if o := f.call(t, refundOf(40)); o.reason != "" {
		t.Errorf("a call not held: %q", o.reason)
	}
}

// A person's denial reaches the agent: the identical call is denied
// approval_denied, with who and why, and opens no request, until the
// denial's time is up. An agent that keeps asking with new arguments is
// bounded: past the principal's requests in the window it is denied
// rate_limited, with when to retry, and pages no one.
func TestApprovalOutcomesReachTheAgent(t *testing.T) {
	var svc *approval.Service
	f := newFixture(t, func(o *Options) {
		o.Rules = mustRules(t, "testdata/approval/policy.yaml")
		svc = serveApprovals(t, o, func(c *approval.Config) { c.DeniedFor, c.MaxNew, c.Window = time.Hour, 3, time.Hour })
	})
	f.billing.push(t, "testdata/pack/catalog.json", nil)
	f.list(t, support, "billing", nil)
	o := f.call(t, refundOf(150))
	if o.data.Approval == nil {
		t.Fatalf("refund of 150: %+v", o)
	}
	id := o.data.Approval.ID
	if _, err := svc.Decide(id, approval.Approver{ID: "bob@acme.example", Groups: []string{"oncall"}}, false, "order A-100 was refunded yesterday"); err != nil {
		t.Fatal(err)
	}
	o = f.call(t, refundOf(150))
	if o.reason != deny.ApprovalDenied || o.data.Approval == nil || o.data.Approval.ID != id || o.data.ReturnTo != deny.ReturnToNone ||
		!strings.Contains(o.data.Detail, "bob@acme.example denied") || !strings.Contains(o.data.Detail, "order A-100 was refunded yesterday") {
		t.Fatalf("the denied call again: %s, %+v", o.reason, o.data)
	}
	if !strings.Contains(f.audit.String(), `"reason":"approval_denied"`) {
		t.Error("approval_denied is not audited")
	}
	// Two more new requests fill the bound of 3; the fourth pages no one.
	for _, amount := range []float64{151, 152} {
		if o := f.call(t, refundOf(amount)); o.reason != deny.ApprovalRequired {
			t.Fatalf("refund of %v: %s", amount, o.reason)
		}
	}
	o = f.call(t, refundOf(153))
	if l := o.data.Limit; o.reason != deny.RateLimited || l == nil || l.Name != "approval_requests" || l.Limit != 3 || l.RetryAfterSeconds <= 0 {
		t.Fatalf("a fourth new request: %s, %+v", o.reason, o.data.Limit)
	}
	if all, _ := svc.List(approval.Filter{}); len(all) != 3 {
		t.Fatalf("%d requests, want 3", len(all))
	}
	// Once the denial's hour is up (and the window's), the call asks again.
	f.clock.advance(time.Hour + time.Second)
	f.billing.push(t, "testdata/pack/catalog.json", nil)
	f.list(t, support, "billing", nil)
	if o := f.call(t, refundOf(150)); o.reason != deny.ApprovalRequired || o.data.Approval.ID == id {
		t.Fatalf("after the denial's time: %s, %+v", o.reason, o.data.Approval)
	}
}
