package decide

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/store"
)

// limitsFixture is the pack's billing catalog under testdata/limits'
// policy: a USD 500 daily budget on refund, 5 lookups a minute.
func limitsFixture(t testing.TB, opts ...func(*Options)) *fixture {
	t.Helper()
	opts = append([]func(*Options){func(o *Options) { o.Rules = mustRules(t, "testdata/limits/policy.yaml") }}, opts...)
	f := newFixture(t, opts...)
	f.billing.push(t, "testdata/pack/catalog.json", nil)
	f.list(t, support, "billing", nil)
	return f
}

func refundOf(amount float64) checkCase {
	return argsCall("refund", fmt.Sprintf(`{"order_id":"A-100","amount":%v,"reason_code":"damaged"}`, amount))
}

// The seed's daily cap: refunds of USD 200 under a USD 500 budget, the
// third denied budget_exhausted with when to retry; a refund that fits
// what is left passes; the next day the budget holds only what is younger
// than a day.
func TestBudgetSpansCalls(t *testing.T) {
	f := limitsFixture(t)
	for i := range 2 {
		if o := f.call(t, refundOf(200)); o.reason != "" {
			t.Fatalf("refund %d: %s (%s)", i+1, o.reason, o.data.Detail)
		}
	}
	o := f.call(t, refundOf(200))
	if o.reason != deny.BudgetExhausted {
		t.Fatalf("third refund: %q, want budget_exhausted", o.reason)
	}
	l := o.data.Limit
	if l == nil || l.Name != "daily_refunds" || l.Limit != 500 || l.Used != 400 || l.Amount != 200 || l.WindowSeconds != 86400 || l.RetryAfterSeconds <= 0 || l.RetryAfterSeconds > 86400+86400/60 {
		t.Fatalf("data.limit = %+v", l)
	}
	if o.data.Reason.ReturnTo() != deny.ReturnToLater {
		t.Errorf("return_to %q", o.data.Reason.ReturnTo())
	}
	// What is left fits; a denied call took nothing.
	if o := f.call(t, refundOf(100)); o.reason != "" {
		t.Fatalf("a refund of what is left: %s (%s)", o.reason, o.data.Detail)
	}
	if o := f.call(t, refundOf(0.01)); o.reason != deny.BudgetExhausted {
		t.Fatalf("a cent over: %q", o.reason)
	}
	if got := testutil.ToFloat64(f.metrics.limits.WithLabelValues("budget", "daily_refunds", "reserved")); got != 3 {
		t.Errorf("reserved counted %v, want 3", got)
	}
	if got := testutil.ToFloat64(f.metrics.limits.WithLabelValues("budget", "daily_refunds", "exhausted")); got != 2 {
		t.Errorf("exhausted counted %v, want 2", got)
	}

	// When the denial said, the window holds nothing: a charge counts until
	// its slot (a sixtieth of the window) ends, and a window after. The
	// snapshot and the catalog are long stale by then: refresh and list.
	f.clock.advance(time.Duration(l.RetryAfterSeconds) * time.Second)
	f.billing.push(t, "testdata/pack/catalog.json", nil)
	f.list(t, support, "billing", nil)
	if o := f.call(t, refundOf(200)); o.reason != "" {
		t.Fatalf("the next day: %s (%s)", o.reason, o.data.Detail)
	}
}

// A rate limit counts calls; its denial says when to retry, and under
// denials.status http_error it is a 429 with Retry-After.
func TestRateLimitRetryAfter(t *testing.T) {
	for _, tt := range []struct {
		form       string
		status     int
		retryAfter bool
	}{{config.StatusOK, 200, false}, {config.StatusHTTPError, 429, true}} {
		t.Run(tt.form, func(t *testing.T) {
			f := limitsFixture(t, func(o *Options) { o.Denials.Status = tt.form })
			for i := range 5 {
				if o := f.call(t, argsCall("lookup_order", lookup)); o.reason != "" {
					t.Fatalf("lookup %d: %s", i+1, o.reason)
				}
			}
			resp, err := f.Check(context.Background(), argsCall("lookup_order", lookup).request())
			if err != nil {
				t.Fatal(err)
			}
			d := resp.GetDeniedResponse()
			if d == nil || int(d.GetStatus().GetCode()) != tt.status {
				t.Fatalf("the sixth lookup: %v, want a denial with status %d", resp, tt.status)
			}
			var after string
			for _, h := range d.GetHeaders() {
				if h.GetHeader().GetKey() == "retry-after" {
					after = h.GetHeader().GetValue()
				}
			}
			if (after != "") != tt.retryAfter || (after != "" && after == "0") {
				t.Errorf("Retry-After %q, want one: %v", after, tt.retryAfter)
			}
			var body struct {
				Error struct {
					Data errorData `json:"data"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(d.GetBody()), &body); err != nil {
				t.Fatal(err)
			}
			if l := body.Error.Data.Limit; body.Error.Data.Reason != deny.RateLimited || l == nil || l.Name != "lookups" || l.Limit != 5 || l.Used != 5 || l.RetryAfterSeconds < 1 {
				t.Errorf("data %+v, limit %+v", body.Error.Data, body.Error.Data.Limit)
			}
			if tt.retryAfter && after != fmt.Sprint(body.Error.Data.Limit.RetryAfterSeconds) {
				t.Errorf("Retry-After %s, data says %d", after, body.Error.Data.Limit.RetryAfterSeconds)
			}
		})
	}
}

// The allowed call's audit line says what it reserved; the denial's, the
// budget it did not fit.
func TestLimitsAudited(t *testing.T) {
	f := limitsFixture(t)
	for range 3 {
		f.call(t, refundOf(250))
	}
	lines := auditLines(t, f)
	allowed, denied := lines[len(lines)-2], lines[len(lines)-1]
	if r, _ := json.Marshal(allowed["reserved"]); string(r) != `[{"amount":250,"kind":"budget","name":"daily_refunds"}]` {
		t.Errorf("reserved %s", r)
	}
	if l, _ := json.Marshal(denied["limit"]); !strings.Contains(string(l), `"name":"daily_refunds"`) || !strings.Contains(string(l), `"used":500`) {
		t.Errorf("limit %s", l)
	}
}

// With the counter store down, a call under a budget is denied
// store_unavailable and one under none is not affected.
func TestLimitsFailClosed(t *testing.T) {
	var failing *failingStore
	f := limitsFixture(t, func(o *Options) {
		mem := o.Snapshots.(*store.Memory)
		failing = &failingStore{Memory: mem}
		o.Snapshots = failing
	})
	f.list(t, auditor, "billing", nil)
	failing.fail = "Reserve"
	if o := f.call(t, refundOf(10)); o.reason != deny.StoreUnavailable {
		t.Errorf("a budgeted call with the counters down: %q", o.reason)
	}
	if o := f.call(t, argsCall("lookup_order", lookup)); o.reason != deny.StoreUnavailable {
		t.Errorf("a rate-limited call with the counters down: %q", o.reason)
	}
	// The auditor's lookups are under no limit, and ask no counter.
	lookupAsAuditor := argsCall("lookup_order", lookup)
	lookupAsAuditor.Principal = auditor
	if o := f.call(t, lookupAsAuditor); o.reason != "" {
		t.Errorf("a call under no limit with the counters down: %q %s", o.reason, o.data.Detail)
	}
	failing.fail = ""
	if o := f.call(t, refundOf(10)); o.reason != "" {
		t.Errorf("with the store back: %q %s", o.reason, o.data.Detail)
	}
}

// On a server whose failed calls give back what they reserved, the answer
// decides: a JSON-RPC error or a tool result with isError gives the
// refund's amount back, a result keeps it; a server without the setting
// hands the response path no ticket.
func TestReleaseOnError(t *testing.T) {
	refund := func(t *testing.T, f *fixture, amount float64) string {
		t.Helper()
		resp, err := f.Check(context.Background(), refundOf(amount).request())
		if err != nil || resp.GetOkResponse() == nil {
			t.Fatalf("refund of %v: %v %v", amount, resp, err)
		}
		return onTheWire(t, resp).GetDynamicMetadata().GetFields()["release"].GetStringValue()
	}
	for _, tt := range []struct {
		name    string
		answer  string
		head    ResponseHead
		give    bool
		settled bool
	}{
		{"a JSON-RPC error", `{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"ledger down"}}`, okJSON, true, true},
		{"a tool error in an event", "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[],\"isError\":true}}\n\n", ResponseHead{Status: 200, ContentType: "text/event-stream"}, true, true},
		{"a result", `{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`, okJSON, false, true},
		{"another id's error", `{"jsonrpc":"2.0","id":2,"error":{"code":1,"message":"x"}}`, okJSON, false, false},
		// A framing clients read differently: the error is not read, and
		// the amount stays taken.
		{"an error in another framing", `{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"ledger down"}}`, ResponseHead{Status: 200, ContentType: "application/json; charset=utf-16"}, false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := limitsFixture(t, func(o *Options) { o.ReleaseOnError = []string{"billing"} })
			refund(t, f, 250)
			ticket := refund(t, f, 250)
			if ticket == "" {
				t.Fatal("no release ticket in the metadata")
			}
			if settled := f.Settle(ticket, tt.head, []byte(tt.answer)); settled != tt.settled {
				t.Errorf("Settle = %v, want %v", settled, tt.settled)
			}
			o := f.call(t, refundOf(250))
			if given := o.reason == ""; given != tt.give {
				t.Fatalf("after the answer, a third refund of 250: %q (%s); want it allowed: %v", o.reason, o.data.Detail, tt.give)
			}
			if got := testutil.ToFloat64(f.metrics.limits.WithLabelValues("budget", "daily_refunds", "released")); (got == 1) != tt.give {
				t.Errorf("released counted %v", got)
			}
			if tt.give {
				if last := auditLines(t, f); last[len(last)-2]["released"] == nil {
					t.Errorf("no released in the audit line: %v", last[len(last)-2])
				}
			}
		})
	}

	f := limitsFixture(t)
	if ticket := refund(t, f, 10); ticket != "" {
		t.Errorf("a server without release_on_error handed out %q", ticket)
	}
	if f.Settle("forged.ticket", okJSON, []byte(`{"jsonrpc":"2.0","id":1,"error":{}}`)) != true {
		t.Error("a forged ticket is not given up on")
	}
}
