package approval_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/approval"
)

type answer struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, method, u, token string, body io.Reader, header ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// code is the stable error code of an answer: the JSON body's error.code,
// or the page's.
func (a answer) code(t *testing.T) string {
	t.Helper()
	if strings.HasPrefix(a.header.Get("Content-Type"), "application/json") {
		var b struct {
			Error approval.APIError `json:"error"`
		}
		if err := json.Unmarshal([]byte(a.body), &b); err != nil {
			t.Fatalf("%v: %s", err, a.body)
		}
		return b.Error.Code
	}
	if m := regexp.MustCompile(`<span id="code">([a-z_]+)</span>`).FindStringSubmatch(a.body); m != nil {
		return m[1]
	}
	return ""
}

// Every bad input to the API has its status and its stable code, and
// nothing is decided by it.
func TestAPIRefusals(t *testing.T) {
	e := newEnv(t, testTokens)
	api := e.srv.URL + "/api/approvals/"
	pending := e.open(t, "sha256:pending")
	decided := e.open(t, "sha256:decided")
	if _, err := e.svc.Decide(decided.ID, testTokens["alice-token"], false, ""); err != nil {
		t.Fatal(err)
	}
	expiring := e.open(t, "sha256:expiring")

	tests := []struct {
		name, method, path, token, body string
		status                          int
		code                            string
		before                          func()
	}{
		{"no token", "GET", pending.ID, "", "", 401, "unauthenticated", nil},
		{"an invalid token", "GET", pending.ID, "forged-token", "", 401, "unauthenticated", nil},
		{"no token to decide", "POST", pending.ID + "/approve", "", "", 401, "unauthenticated", nil},
		{"a forged id", "GET", "..%2F..%2Fetc", "alice-token", "", 404, "not_found", nil},
		{"an id of the wrong length", "GET", pending.ID + "A", "alice-token", "", 404, "not_found", nil},
		{"an unknown id", "GET", approval.NewID(), "alice-token", "", 404, "not_found", nil},
		{"an unknown id, approved", "POST", approval.NewID() + "/approve", "alice-token", "", 404, "not_found", nil},
		{"an unknown action", "POST", pending.ID + "/escalate", "alice-token", "", 404, "not_found", nil},
		{"outside the rule, looking", "GET", pending.ID, "carol-token", "", 403, "not_an_approver", nil},
		{"outside the rule, approving", "POST", pending.ID + "/approve", "carol-token", "", 403, "not_an_approver", nil},
		{"the requester approving its own call", "POST", pending.ID + "/approve", "agent-token", "", 403, "self_approval", nil},
		{"a body that is not JSON", "POST", pending.ID + "/approve", "alice-token", "approve!", 400, "bad_request", nil},
		{"an unknown state", "GET", "?state=maybe", "alice-token", "", 400, "bad_request", nil},
		{"already decided", "POST", decided.ID + "/approve", "alice-token", "", 409, "already_decided", nil},
		{"the store down, looking", "GET", pending.ID, "alice-token", "", 503, "store_unavailable", func() { e.store.down.Store(true) }},
		{"the store down, approving", "POST", pending.ID + "/approve", "alice-token", "", 503, "store_unavailable", nil},
		{"the store down, listing", "GET", "", "alice-token", "", 503, "store_unavailable", nil},
		{"expired", "POST", expiring.ID + "/approve", "alice-token", "", 410, "expired", func() {
			e.store.down.Store(false)
			e.clock.Advance(time.Hour)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.before != nil {
				tt.before()
			}
			before := e.counter(t, "capsnap_approvals_refused_total", tt.code)
			u := api + tt.path
			if strings.HasPrefix(tt.path, "?") || tt.path == "" {
				u = strings.TrimSuffix(api, "/") + tt.path
			}
			a := do(t, tt.method, u, tt.token, strings.NewReader(tt.body))
			if a.status != tt.status || a.code(t) != tt.code {
				t.Fatalf("%s %s = %d %q, want %d %q\n%s", tt.method, u, a.status, a.code(t), tt.status, tt.code, a.body)
			}
			if tt.status == 401 && a.header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			if got := e.counter(t, "capsnap_approvals_refused_total", tt.code); got != before+1 {
				t.Errorf("refused_total{code=%s} = %v, want %v", tt.code, got, before+1)
			}
		})
	}
	for _, id := range []string{pending.ID, expiring.ID} {
		r, err := e.store.Get(id, e.clock.Now().Add(-time.Hour))
		if err != nil || r.State != approval.Pending || r.DecidedBy != "" {
			t.Errorf("request %s after the refusals: %s by %q, %v; want pending, undecided", id, r.State, r.DecidedBy, err)
		}
	}
}

// The API shows an approver the requests it may decide, and decides them.
func TestAPI(t *testing.T) {
	e := newEnv(t, testTokens)
	api := e.srv.URL + "/api/approvals"
	a := e.open(t, "sha256:a")
	other := openFor(t, e, "spiffe://acme/agent/other", []string{"carol@acme.example"})

	var list struct {
		Approvals []approval.View `json:"approvals"`
	}
	ans := do(t, "GET", api+"?state=pending", "bob-token", nil)
	if err := json.Unmarshal([]byte(ans.body), &list); err != nil || ans.status != 200 {
		t.Fatalf("list: %d %v %s", ans.status, err, ans.body)
	}
	if len(list.Approvals) != 1 || list.Approvals[0].ID != a.ID || list.Approvals[0].URL != e.srv.URL+"/approvals/"+a.ID {
		t.Fatalf("bob's list = %+v; want only %s, with its URL", list.Approvals, a.ID)
	}
	if !strings.Contains(ans.body, `"note": "<script>alert(1)</script>"`) {
		t.Errorf("the arguments are not in the answer as sent:\n%s", ans.body)
	}
	ans = do(t, "GET", api+"?principal=spiffe://acme/agent/other", "carol-token", nil)
	if err := json.Unmarshal([]byte(ans.body), &list); err != nil || len(list.Approvals) != 1 || list.Approvals[0].ID != other.ID {
		t.Fatalf("carol's list by principal = %v, %s", err, ans.body)
	}

	ans = do(t, "POST", api+"/"+a.ID+"/approve", "bob-token", strings.NewReader(`{"reason":"order checked"}`))
	var v approval.View
	if err := json.Unmarshal([]byte(ans.body), &v); err != nil || ans.status != 200 {
		t.Fatalf("approve: %d %v %s", ans.status, err, ans.body)
	}
	if v.State != approval.Approved || v.DecidedBy != "bob@acme.example" || v.Reason != "order checked" || !v.Expires.Equal(e.clock.Now().Add(a.ApprovalTTL)) {
		t.Fatalf("approved as %+v", v)
	}
	ans = do(t, "POST", api+"/"+other.ID+"/deny", "carol-token", nil)
	if ans.status != 200 || !strings.Contains(ans.body, `"state": "denied"`) {
		t.Fatalf("deny: %d %s", ans.status, ans.body)
	}
	events := e.audited()
	if len(events) != 4 || events[2].Kind != approval.EventApproved || events[2].Approver.ID != "bob@acme.example" ||
		events[2].Approver.Groups[0] != "billing-oncall" || events[3].Kind != approval.EventDenied {
		t.Fatalf("audited %+v", events)
	}
}

// openFor opens a request of principal's that approvers may decide.
func openFor(t *testing.T, e *env, principal string, approvers []string) approval.Request {
	t.Helper()
	req := approval.Request{
		Binding:   approval.Binding{Principal: principal, Server: "billing", Tool: "refund", SchemaDigest: "sha256:5c", PolicyDigest: "sha256:9d", ArgsDigest: "sha256:o"},
		Arguments: json.RawMessage(`{}`), EffectClass: "money_move", Rule: "r", Approvers: approvers, ApprovalTTL: time.Minute,
	}
	r, err := e.svc.Open(req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// browser is a cookie-holding client for the page.
type browser struct {
	t      *testing.T
	e      *env
	cookie string
}

func (e *env) signIn(t *testing.T, token string) *browser {
	t.Helper()
	a := do(t, "GET", e.srv.URL+"/approvals/"+approval.NewID()+"?token="+url.QueryEscape(token), "", nil)
	if a.status != 200 {
		t.Fatalf("sign in with %s: %d\n%s", token, a.status, a.body)
	}
	c := a.header.Get("Set-Cookie")
	for _, attr := range []string{"HttpOnly", "SameSite=Strict", "Path=/approvals"} {
		if !strings.Contains(c, attr) {
			t.Fatalf("cookie %q lacks %s", c, attr)
		}
	}
	return &browser{t, e, strings.SplitN(c, ";", 2)[0]}
}

func (b *browser) get(id string) answer {
	return do(b.t, "GET", b.e.srv.URL+"/approvals/"+id, "", nil, "Cookie", b.cookie)
}

func (b *browser) csrf(id string) string {
	b.t.Helper()
	m := csrfField.FindStringSubmatch(b.get(id).body)
	if m == nil {
		b.t.Fatalf("no CSRF token on the page of %s", id)
	}
	return m[1]
}

func (b *browser) post(id string, form url.Values, header ...string) answer {
	return do(b.t, "POST", b.e.srv.URL+"/approvals/"+id, "", strings.NewReader(form.Encode()),
		append([]string{"Cookie", b.cookie, "Content-Type", "application/x-www-form-urlencoded", "Sec-Fetch-Site", "same-origin"}, header...)...)
}

// The page refuses every bad form with its status and stable code, and
// decides nothing by it.
func TestPageRefusals(t *testing.T) {
	e := newEnv(t, testTokens, func(c *approval.Config) { c.PendingTTL = 3 * time.Hour })
	alice, carol, agentB := e.signIn(t, "alice-token"), e.signIn(t, "carol-token"), e.signIn(t, "agent-token")
	r := e.open(t, "sha256:r")
	other := e.open(t, "sha256:other")
	good := alice.csrf(r.ID)
	form := func(csrf, action string) url.Values { return url.Values{"csrf": {csrf}, "action": {action}} }

	tests := []struct {
		name   string
		do     func() answer
		status int
		code   string
	}{
		{"no CSRF token", func() answer { return alice.post(r.ID, url.Values{"action": {"approve"}}) }, 403, "csrf"},
		{"a forged CSRF token", func() answer { return alice.post(r.ID, form("1700000000.AAAAAAAAAAAAAAAAAAAAAA", "approve")) }, 403, "csrf"},
		{"another request's CSRF token", func() answer { return alice.post(other.ID, form(good, "approve")) }, 403, "csrf"},
		{"another approver's CSRF token", func() answer { return e.signIn(t, "bob-token").post(r.ID, form(good, "approve")) }, 403, "csrf"},
		{"cross-site", func() answer { return alice.post(r.ID, form(good, "approve"), "Sec-Fetch-Site", "cross-site") }, 403, "cross_origin"},
		{"another origin", func() answer {
			return alice.post(r.ID, form(good, "approve"), "Sec-Fetch-Site", "", "Origin", "https://evil.example")
		}, 403, "cross_origin"},
		{"no cookie", func() answer {
			return do(t, "POST", e.srv.URL+"/approvals/"+r.ID, "", strings.NewReader(form(good, "approve").Encode()),
				"Content-Type", "application/x-www-form-urlencoded")
		}, 401, "unauthenticated"},
		{"a bearer token is no cookie", func() answer {
			return do(t, "POST", e.srv.URL+"/approvals/"+r.ID, "alice-token", strings.NewReader(form(good, "approve").Encode()),
				"Content-Type", "application/x-www-form-urlencoded")
		}, 401, "unauthenticated"},
		{"no action", func() answer { return alice.post(r.ID, form(good, "")) }, 400, "bad_request"},
		{"a reason too long", func() answer {
			return alice.post(r.ID, url.Values{"csrf": {good}, "action": {"deny"}, "reason": {strings.Repeat("x", 1001)}})
		}, 400, "bad_request"},
		{"outside the rule, looking", func() answer { return carol.get(r.ID) }, 403, "not_an_approver"},
		{"the requester approving", func() answer { return agentB.post(r.ID, form(agentB.csrf(r.ID), "approve")) }, 403, "self_approval"},
		{"a forged id", func() answer { return alice.get("x'><script>") }, 404, "not_found"},
		{"an unknown id", func() answer { return alice.get(approval.NewID()) }, 404, "not_found"},
		{"an unknown id, posted", func() answer { return alice.post(approval.NewID(), form(good, "approve")) }, 403, "csrf"},
		{"a forged id, posted", func() answer { return alice.post("forged", form(good, "approve")) }, 404, "not_found"},
		{"not signed in", func() answer { return do(t, "GET", e.srv.URL+"/approvals/"+r.ID, "", nil) }, 401, "unauthenticated"},
		{"an invalid token in the URL", func() answer { return do(t, "GET", e.srv.URL+"/approvals/"+r.ID+"?token=forged", "", nil) }, 401, "unauthenticated"},
		{"the store down", func() answer { e.store.down.Store(true); return alice.post(r.ID, form(good, "approve")) }, 503, "store_unavailable"},
		{"the store down, looking", func() answer { return alice.get(r.ID) }, 503, "store_unavailable"},
		{"a stale CSRF token", func() answer {
			e.store.down.Store(false)
			e.clock.Advance(csrfAge)
			return alice.post(r.ID, form(good, "approve"))
		}, 403, "csrf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := tt.do()
			if a.status != tt.status || a.code(t) != tt.code {
				t.Fatalf("= %d %q, want %d %q\n%s", a.status, a.code(t), tt.status, tt.code, a.body)
			}
			if tt.status == 401 && !strings.Contains(a.body, `action="/approvals/login"`) {
				t.Errorf("401 without the sign-in form:\n%s", a.body)
			}
		})
	}
	if got, err := e.store.Get(r.ID, e.clock.Now()); err != nil || got.State != approval.Pending {
		t.Fatalf("after the refusals the request is %s, %v; want pending", got.State, err)
	}
	// A fresh token decides.
	if a := alice.post(r.ID, form(alice.csrf(r.ID), "approve")); a.status != http.StatusSeeOther || a.header.Get("Location") != "/approvals/"+r.ID {
		t.Fatalf("approve = %d %s\n%s", a.status, a.header.Get("Location"), a.body)
	}
	if got, _ := e.store.Get(r.ID, e.clock.Now()); got.State != approval.Approved || got.DecidedBy != "alice@acme.example" {
		t.Fatalf("approved as %s by %s", got.State, got.DecidedBy)
	}
}

// csrfAge is older than a page's form may be posted.
const csrfAge = time.Hour + time.Minute

// The page shows the request as its approver must see it: every argument
// as text, never markup; and its headers forbid scripts, framing and
// caching.
func TestPageShowsTheRequest(t *testing.T) {
	e := newEnv(t, testTokens)
	r := e.open(t, "sha256:r")
	a := do(t, "GET", e.srv.URL+"/approvals/"+r.ID+"?token=bob-token", "", nil)
	if a.status != 200 || !strings.Contains(a.body, `<meta http-equiv="refresh" content="0; url=/approvals/`+r.ID+`">`) {
		t.Fatalf("token exchange: %d\n%s", a.status, a.body)
	}
	bob := e.signIn(t, "bob-token")
	page := bob.get(r.ID)
	if page.status != 200 {
		t.Fatalf("page: %d\n%s", page.status, page.body)
	}
	for _, want := range []string{
		agent, "refund", "billing", "money_move", "sha256:5c", "sha256:9d", "sha256:r",
		"tools.refund.approval (args.amount &gt; 100)",
		`&#34;note&#34;: &#34;&lt;script&gt;alert(1)&lt;/script&gt;&#34;`,
		`id="approve"`, `id="deny"`, "signed in as bob@acme.example",
	} {
		if !strings.Contains(page.body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(page.body, "<script>") {
		t.Error("an argument's markup is on the page as markup")
	}
	for h, want := range map[string]string{
		"Content-Security-Policy": "default-src 'none'; style-src 'sha256-",
		"X-Frame-Options":         "DENY",
		"Cache-Control":           "no-store",
		"Referrer-Policy":         "no-referrer",
	} {
		if !strings.HasPrefix(page.header.Get(h), want) {
			t.Errorf("%s: %q, want %q…", h, page.header.Get(h), want)
		}
	}
	// The requester, in the group, sees the request but no Approve.
	own := e.signIn(t, "agent-token").get(r.ID)
	if own.status != 200 || strings.Contains(own.body, `id="approve"`) || !strings.Contains(own.body, `id="self"`) {
		t.Errorf("the requester's page offers Approve:\n%s", own.body)
	}
}

// Signing in through the form sets the cookie and goes on to the request.
func TestSignInForm(t *testing.T) {
	e := newEnv(t, testTokens)
	r := e.open(t, "sha256:r")
	post := func(token, next string, header ...string) answer {
		return do(t, "POST", e.srv.URL+"/approvals/login", "", strings.NewReader(url.Values{"token": {token}, "next": {next}}.Encode()),
			append([]string{"Content-Type", "application/x-www-form-urlencoded"}, header...)...)
	}
	a := post("alice-token", r.ID)
	if a.status != http.StatusSeeOther || a.header.Get("Location") != "/approvals/"+r.ID || !strings.Contains(a.header.Get("Set-Cookie"), "HttpOnly") {
		t.Fatalf("sign in = %d %s %s", a.status, a.header.Get("Location"), a.header.Get("Set-Cookie"))
	}
	if a := post("alice-token", "https://evil.example/"); a.status != 200 || a.header.Get("Location") != "" {
		t.Fatalf("sign in, next elsewhere = %d %s", a.status, a.header.Get("Location"))
	}
	if a := post("forged", r.ID); a.status != 401 || a.header.Get("Set-Cookie") != "" {
		t.Fatalf("sign in with a forged token = %d %s", a.status, a.header.Get("Set-Cookie"))
	}
	if a := post("alice-token", r.ID, "Sec-Fetch-Site", "cross-site"); a.status != 403 || a.code(t) != "cross_origin" {
		t.Fatalf("sign in from another site = %d %s", a.status, a.code(t))
	}
}

// With development tokens every page says so; with a real authenticator
// none does.
func TestDevBanner(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(path, []byte("tokens:\n  - {token: oncall-token-0123456789, approver: alice@acme.example}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dev, err := approval.LoadDevTokens(path, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		auth   approval.Authenticator
		token  string
		banner bool
	}{{dev, "oncall-token-0123456789", true}, {testTokens, "alice-token", false}} {
		e := newEnv(t, tc.auth)
		r := e.open(t, "sha256:r")
		page := e.signIn(t, tc.token).get(r.ID)
		signIn := do(t, "GET", e.srv.URL+"/approvals/"+r.ID, "", nil)
		for _, a := range []answer{page, signIn} {
			if got := strings.Contains(a.body, `id="dev"`); got != tc.banner {
				t.Errorf("%T: banner %v, want %v", tc.auth, got, tc.banner)
			}
		}
	}
}
