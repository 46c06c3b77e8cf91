package approval_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/storetest"
	"github.com/capsnap/capsnap/testbed"
	"github.com/rs/zerolog"
)

// What the decision core does with an approval, end to end on one
// service: a call opens a request, its retry opens no other, an approver
// approves it, the identical call consumes it once, and a call with other
// arguments needs its own. Each step is audited and counted.
func TestServiceLifecycle(t *testing.T) {
	e := newEnv(t, testTokens)
	b := storetest.Binding(agent, "sha256:a1")
	call := storetest.Request(b, time.Time{})
	call.ID, call.State = "", ""

	r, err := e.svc.Open(call)
	if err != nil {
		t.Fatal(err)
	}
	if !approval.ValidID(r.ID) || r.State != approval.Pending || !r.Created.Equal(e.clock.Now()) ||
		!r.Expires.Equal(e.clock.Now().Add(approval.DefaultPendingTTL)) {
		t.Fatalf("opened %+v", r)
	}
	if got := e.svc.URL(r.ID); got != e.srv.URL+"/approvals/"+r.ID {
		t.Fatalf("URL = %s", got)
	}
	e.clock.Advance(time.Minute)
	if again, err := e.svc.Open(call); err != nil || again.ID != r.ID {
		t.Fatalf("the retry opened %s, %v; want %s", again.ID, err, r.ID)
	}
	if _, ok, err := e.svc.Consume(b); ok || err != nil {
		t.Fatalf("consumed before approval: %v, %v", ok, err)
	}
	bob := testTokens["bob-token"]
	if _, err := e.svc.Decide(r.ID, bob, true, "ok"); err != nil {
		t.Fatal(err)
	}
	other := b
	other.ArgsDigest = "sha256:a2"
	if _, ok, err := e.svc.Consume(other); ok || err != nil {
		t.Fatalf("other arguments consumed the approval: %v, %v", ok, err)
	}
	used, ok, err := e.svc.Consume(b)
	if !ok || err != nil || used.ID != r.ID || used.State != approval.Consumed {
		t.Fatalf("Consume = %+v, %v, %v", used, ok, err)
	}
	if _, ok, err := e.svc.Consume(b); ok || err != nil {
		t.Fatalf("consumed twice: %v, %v", ok, err)
	}
	next, err := e.svc.Open(call)
	if err != nil || next.ID == r.ID {
		t.Fatalf("the call after its approval was used opened %s, %v; want a new request", next.ID, err)
	}

	var kinds []approval.EventKind
	for _, ev := range e.audited() {
		kinds = append(kinds, ev.Kind)
	}
	want := []approval.EventKind{approval.EventRequested, approval.EventApproved, approval.EventConsumed, approval.EventRequested}
	if strings.Join(strs(kinds), " ") != strings.Join(strs(want), " ") {
		t.Fatalf("audited %v, want %v", kinds, want)
	}
	if ev := e.audited()[1]; ev.Approver.ID != bob.ID || ev.Request.DecidedBy != bob.ID || ev.Request.Binding != b {
		t.Fatalf("the decision audited as %+v", ev)
	}
	for event, n := range map[string]float64{"requested": 2, "approved": 1, "denied": 0, "consumed": 1, "expired": 0} {
		if got := e.counter(t, "capsnap_approvals_total", event); got != n {
			t.Errorf("capsnap_approvals_total{event=%s} = %v, want %v", event, got, n)
		}
	}

	// Lapsed, the new request is swept once, audited and counted.
	if err := e.svc.Sweep(); err != nil {
		t.Fatal(err)
	}
	if got := e.counter(t, "capsnap_approvals_pending"); got != 1 {
		t.Errorf("pending = %v, want 1", got)
	}
	e.clock.Advance(approval.DefaultPendingTTL)
	for range 2 {
		if err := e.svc.Sweep(); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.counter(t, "capsnap_approvals_total", "expired"); got != 1 {
		t.Errorf("expired = %v, want 1", got)
	}
	if got := e.counter(t, "capsnap_approvals_pending"); got != 0 {
		t.Errorf("pending = %v, want 0", got)
	}
	if last := e.audited()[len(e.audited())-1]; last.Kind != approval.EventExpired || last.Request.ID != next.ID {
		t.Fatalf("last audited %+v", last)
	}

	// A store that cannot answer lets nothing through.
	e.store.down.Store(true)
	if _, ok, err := e.svc.Consume(b); ok || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Consume with the store down = %v, %v", ok, err)
	}
}

func strs(ks []approval.EventKind) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = string(k)
	}
	return out
}

func TestNewRefuses(t *testing.T) {
	store := approval.NewMemory(time.Hour)
	for name, c := range map[string]approval.Config{
		"no store":             {BaseURL: "https://approvals.acme.example"},
		"no base URL":          {Store: store},
		"a relative base URL":  {Store: store, BaseURL: "/approvals"},
		"a base URL, queried":  {Store: store, BaseURL: "https://approvals.acme.example/?x=1"},
		"another scheme":       {Store: store, BaseURL: "ftp://approvals.acme.example"},
		"a relative webhook":   {Store: store, BaseURL: "https://a.example", Webhook: approval.WebhookConfig{URL: "/hook"}},
		"a webhook of a file":  {Store: store, BaseURL: "https://a.example", Webhook: approval.WebhookConfig{URL: "file:///etc/passwd"}},
		"a webhook, no scheme": {Store: store, BaseURL: "https://a.example", Webhook: approval.WebhookConfig{URL: "hooks.slack.com/x"}},
	} {
		if s, err := approval.New(c); err == nil {
			s.Close()
			t.Errorf("%s: no error", name)
		}
	}
}

// A new request is announced to the webhook in a body a Slack-style
// incoming webhook shows as text, with the same as fields and never the
// arguments; a retry announces nothing.
func TestWebhook(t *testing.T) {
	got := make(chan []byte, 10)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			w.WriteHeader(http.StatusBadRequest)
		}
		got <- b
	}))
	defer recv.Close()
	e := newEnv(t, testTokens, func(c *approval.Config) { c.Webhook.URL = recv.URL + "/services/T000/B000/XXX" })
	req := storetest.Request(storetest.Binding("spiffe://acme/agent/<evil|click here>", "sha256:a1"), time.Time{})
	r, err := e.svc.Open(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Open(req); err != nil {
		t.Fatal(err)
	}
	var body []byte
	select {
	case body = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no announcement")
	}
	var b approval.WebhookBody
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{e.svc.URL(r.ID), "spiffe://acme/agent/&lt;evil|click here&gt;", "refund", "billing", "money_move", "tools.refund.approval (args.amount &gt; 100)"} {
		if !strings.Contains(b.Text, want) {
			t.Errorf("text %q lacks %q", b.Text, want)
		}
	}
	if a := b.Approval; a.ID != r.ID || a.URL != e.svc.URL(r.ID) || a.Principal != r.Binding.Principal || a.ArgsDigest != "sha256:a1" ||
		a.EffectClass != "money_move" || !a.Expires.Equal(r.Expires) || len(a.Approvers) != 2 {
		t.Errorf("approval fields %+v", a)
	}
	if strings.Contains(string(body), "A-100") || strings.Contains(string(body), `"arguments"`) {
		t.Errorf("the announcement holds the arguments: %s", body)
	}
	waitFor(t, func() bool { return e.counter(t, "capsnap_approvals_webhooks_total", "sent") == 1 })
	select {
	case b := <-got:
		t.Fatalf("the retry was announced: %s", b)
	case <-time.After(100 * time.Millisecond):
	}
}

// A webhook that fails, hangs or cannot keep up is logged and counted,
// and never holds up a request.
func TestWebhookNeverBlocks(t *testing.T) {
	release := make(chan struct{})
	var calls = make(chan string, 100)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls <- r.URL.Path
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer recv.Close()
	defer close(release)

	e := newEnv(t, testTokens, func(c *approval.Config) {
		c.Webhook = approval.WebhookConfig{URL: recv.URL + "/fail", Timeout: time.Second}
	})
	e.open(t, "sha256:f")
	waitFor(t, func() bool { return e.counter(t, "capsnap_approvals_webhooks_total", "failed") == 1 })

	hang := newEnv(t, testTokens, func(c *approval.Config) {
		c.Webhook = approval.WebhookConfig{URL: recv.URL + "/hang", Timeout: 2 * time.Second, Queue: 1}
	})
	start := time.Now()
	for i := range 5 {
		hang.open(t, "sha256:h"+string(rune('0'+i)))
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("opening 5 requests behind a hanging webhook took %v", took)
	}
	// One posting, one queued, three dropped; the posting one times out.
	if got := hang.counter(t, "capsnap_approvals_webhooks_total", "dropped"); got < 3 {
		t.Errorf("dropped = %v, want at least 3", got)
	}
	waitFor(t, func() bool { return hang.counter(t, "capsnap_approvals_webhooks_total", "failed") >= 1 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A principal opens at most MaxNew requests in the window: the next new
// one is refused with when to retry, counted, and announced to the webhook
// once a window; a retry of a call it already holds is never refused.
func TestNewRequestsArePerPrincipalBounded(t *testing.T) {
	got := make(chan []byte, 10)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
	}))
	defer recv.Close()
	e := newEnv(t, testTokens, func(c *approval.Config) {
		c.MaxNew, c.Window, c.Webhook.URL = 2, time.Hour, recv.URL
	})
	open := func(principal, args string) (approval.Request, error) {
		return e.svc.Open(storetest.Request(storetest.Binding(principal, args), time.Time{}))
	}
	first, err := open("looper", "sha256:a1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open("looper", "sha256:a2"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	for range 3 {
		_, err = open("looper", "sha256:a3")
		var limited *approval.LimitError
		if !errors.As(err, &limited) || !errors.Is(err, approval.ErrTooManyRequests) || limited.Used != 2 || limited.Max != 2 || limited.RetryAfter != 59*time.Minute {
			t.Fatalf("a third new request: %v", err)
		}
	}
	if again, err := open("looper", "sha256:a1"); err != nil || again.ID != first.ID {
		t.Fatalf("the retry of a held call: %+v, %v", again, err)
	}
	if _, err := open("someone-else", "sha256:a3"); err != nil {
		t.Fatalf("another principal was bounded: %v", err)
	}
	if n := e.counter(t, "capsnap_approvals_limited_total", ""); n != 3 {
		t.Errorf("limited counted %v, want 3", n)
	}
	var limitedAnnouncements int
	deadline := time.After(5 * time.Second)
	for done := false; !done; {
		select {
		case body := <-got:
			var b approval.WebhookBody
			if err := json.Unmarshal(body, &b); err != nil {
				t.Fatal(err)
			}
			if b.Limited != nil {
				limitedAnnouncements++
				if b.Limited.Principal != "looper" || b.Limited.Max != 2 || b.Limited.WindowSeconds != 3600 || !strings.Contains(b.Text, "looper opened 2 approval requests") {
					t.Errorf("announcement %s", body)
				}
			}
		case <-deadline:
			done = true
		case <-time.After(300 * time.Millisecond):
			done = true
		}
	}
	if limitedAnnouncements != 1 {
		t.Errorf("%d announcements of the bound, want 1", limitedAnnouncements)
	}
	e.clock.Advance(time.Hour)
	if _, err := open("looper", "sha256:a3"); err != nil {
		t.Fatalf("after the window: %v", err)
	}
}

// A store that cannot answer the sweep is one warning, not one a sweep,
// and its return is said once.
func TestSweepFailureIsSaidOnce(t *testing.T) {
	var logged testbed.SyncBuffer
	e := newEnv(t, testTokens, func(c *approval.Config) { c.Log = zerolog.New(&logged) })
	e.store.down.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { e.svc.Run(ctx, 5*time.Millisecond); close(done) }()
	time.Sleep(100 * time.Millisecond)
	e.store.down.Store(false)
	time.Sleep(100 * time.Millisecond)
	cancel()
	<-done
	if n := strings.Count(logged.String(), "approval sweep failed"); n != 1 {
		t.Errorf("%d warnings for one outage, want 1:\n%s", n, logged.String())
	}
	if n := strings.Count(logged.String(), "approval sweep succeeded again"); n != 1 {
		t.Errorf("%d recoveries said, want 1:\n%s", n, logged.String())
	}
}
