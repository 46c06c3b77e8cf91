package approval

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"
)

//go:embed templates
var templateFS embed.FS

var (
	style     = mustRead("templates/style.css")
	styleHash = func() string {
		sum := sha256.Sum256([]byte(style))
		return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
	}()
	requestPage = template.Must(template.ParseFS(templateFS, "templates/layout.html", "templates/request.html"))
	messagePage = template.Must(template.ParseFS(templateFS, "templates/layout.html", "templates/message.html"))
)

func mustRead(name string) string {
	b, err := templateFS.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// pageData is what the templates show. html/template escapes every value
// for where it stands, so an argument reads as text, never as markup.
type pageData struct {
	Title    string
	CSS      template.CSS
	Dev      bool
	Approver string
	Refresh  string

	Request *Request
	// Arguments are the call's, indented; for a review of a change, the
	// definition under review.
	Arguments string
	// Changes are a review's changes, at most maxShownChanges, and
	// ChangesCut how many more there are.
	Changes    []shownChange
	ChangesCut int
	Created    string
	Expires    string
	TTL        string
	CSRF       string
	CanApprove bool
	Outcome    string

	Error   bool
	Message string
	Code    string
	Login   bool
	Next    string
	Back    string
}

func (h *handler) render(w http.ResponseWriter, status int, t *template.Template, d pageData) {
	d.CSS, d.Dev = template.CSS(style), h.dev
	var b bytes.Buffer
	if err := t.ExecuteTemplate(&b, "layout", d); err != nil {
		h.log.Error().Err(err).Msg("approval page failed to render")
		http.Error(w, "the page failed to render", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// pageRefuse answers a browser with err's refusal, and a way back to
// request id: the sign-in form for a missing or invalid token, a link to
// its page for a decision refused.
func (h *handler) pageRefuse(w http.ResponseWriter, r *http.Request, err error, approver, id string) {
	ref := h.refused(r, err)
	d := pageData{Title: ref.title, Error: true, Message: ref.message, Code: ref.code, Approver: approver}
	switch {
	case !ValidID(id) || ref.code == "not_found":
	case ref.status == http.StatusUnauthorized:
		d.Error, d.Login, d.Next = false, true, id
		d.Message = "Sign in with your approver token to see this request."
	case r.Method == http.MethodPost:
		d.Back = "/approvals/" + id
	}
	h.render(w, ref.status, messagePage, d)
}

// cookie authenticates a browser by its cookie.
func (h *handler) cookie(r *http.Request) (Approver, error) {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return Approver{}, unauthenticated("no token")
	}
	return h.auth.Authenticate(r.Context(), c.Value)
}

func (h *handler) setCookie(w http.ResponseWriter, token string) {
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: token, Path: "/approvals",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: h.s.secure(),
	})
}

func (h *handler) page(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if tok := r.URL.Query().Get("token"); tok != "" {
		h.exchange(w, r, tok, id)
		return
	}
	a, err := h.cookie(r)
	if err != nil {
		h.pageRefuse(w, r, err, "", id)
		return
	}
	req, err := h.visible(a, id)
	if err != nil {
		h.pageRefuse(w, r, err, a.ID, "")
		return
	}
	h.render(w, http.StatusOK, requestPage, h.requestData(a, req))
}

// exchange trades a token in the URL for the cookie, then moves to the
// URL without it, from a page of its own: a navigation a same-origin page
// starts is same-site, so the SameSite=Strict cookie goes with it, where a
// redirect at the end of a link from a chat tool would not carry it.
func (h *handler) exchange(w http.ResponseWriter, r *http.Request, token, id string) {
	a, err := h.auth.Authenticate(r.Context(), token)
	if err != nil {
		h.pageRefuse(w, r, err, "", id)
		return
	}
	if !ValidID(id) {
		h.pageRefuse(w, r, ErrNotFound, a.ID, "")
		return
	}
	h.setCookie(w, token)
	h.render(w, http.StatusOK, messagePage, pageData{
		Title: "Signed in", Message: "Opening the request…", Approver: a.ID, Refresh: "/approvals/" + id,
	})
}

// shownChange is one change of a review, as tooldiff.Diff marshals it.
type shownChange struct {
	Kind  string          `json:"kind"`
	Field string          `json:"field"`
	From  json.RawMessage `json:"from"`
	To    json.RawMessage `json:"to"`
	Words []struct {
		Op   string `json:"op"`
		Text string `json:"text"`
	} `json:"words"`
}

// Was and Is are the change's old and new values as JSON text; none for a
// change its Words show (a text edited in more than its spacing).
func (c shownChange) Was() string { return c.value(c.From) }

func (c shownChange) Is() string { return c.value(c.To) }

func (c shownChange) value(v json.RawMessage) string {
	for _, w := range c.Words {
		if w.Op != "=" {
			return ""
		}
	}
	return string(v)
}

// maxShownChanges bounds the changes a review's page lists: a server
// cannot make the page unreadable, or slow, through one tool.
const maxShownChanges = 200

func (h *handler) requestData(a Approver, req Request) pageData {
	shown := req.Arguments
	if req.Change != nil {
		shown = json.RawMessage(req.Change.Definition)
	}
	args := string(shown)
	var pretty bytes.Buffer
	if json.Indent(&pretty, shown, "", "  ") == nil {
		args = pretty.String()
	}
	now := h.s.c.Now()
	d := pageData{
		Title: fmt.Sprintf("%s on %s", req.Binding.Tool, req.Binding.Server), Approver: a.ID,
		Request: &req, Arguments: args, TTL: human(req.ApprovalTTL),
		Created: when(req.Created, now), Expires: when(req.Expires, now),
		CSRF:       h.csrfToken(a.ID, req.ID, now),
		CanApprove: a.ID != req.Binding.Principal || req.SelfApprove,
	}
	if req.Change != nil {
		var diff struct {
			Changes []shownChange `json:"changes"`
		}
		_ = json.Unmarshal(req.Change.Diff, &diff) // capsnap wrote it; unreadable shows no list
		d.Changes = diff.Changes
		if len(d.Changes) > maxShownChanges {
			d.Changes, d.ChangesCut = d.Changes[:maxShownChanges], len(d.Changes)-maxShownChanges
		}
		d.Outcome = changeOutcome(req)
		return d
	}
	switch req.State {
	case Approved:
		d.Outcome = fmt.Sprintf("Approved by %s at %s. The call may run once.", req.DecidedBy, stamp(req.DecidedAt))
	case Denied:
		d.Outcome = fmt.Sprintf("Denied by %s at %s.", req.DecidedBy, stamp(req.DecidedAt))
	case Consumed:
		d.Outcome = fmt.Sprintf("Approved by %s at %s, and the call has run.", req.DecidedBy, stamp(req.DecidedAt))
	case Expired:
		d.Outcome = "Expired: no one decided in time, or the approved call did not come. The agent's next call asks again."
	}
	return d
}

// changeOutcome says where a review of a change stands, once decided.
func changeOutcome(req Request) string {
	switch req.State {
	case Approved:
		return fmt.Sprintf("Approved by %s at %s. Agents get the new definition when they list again.", req.DecidedBy, stamp(req.DecidedAt))
	case Consumed:
		return fmt.Sprintf("Approved by %s at %s, and in force.", req.DecidedBy, stamp(req.DecidedAt))
	case Denied:
		return fmt.Sprintf("Rejected by %s at %s. The tool stays withheld while its server lists this definition.", req.DecidedBy, stamp(req.DecidedAt))
	case Expired:
		return "Expired: no one decided in time. The next listing that sees this definition opens a new review."
	}
	return ""
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

// when is t, and how far it is from now.
func when(t, now time.Time) string {
	d := t.Sub(now).Round(time.Second)
	switch {
	case d > 0:
		return fmt.Sprintf("%s (in %s)", stamp(t), human(d))
	case d < 0:
		return fmt.Sprintf("%s (%s ago)", stamp(t), human(-d))
	}
	return stamp(t) + " (now)"
}

// human is d in words a person reads at a glance: "1 h 5 min", "15 min",
// "40 s".
func human(d time.Duration) string {
	d = d.Round(time.Second)
	var parts []string
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "min"}, {time.Second, "s"}} {
		if n := d / u.d; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, u.name))
			d -= n * u.d
		}
	}
	if len(parts) == 0 {
		return "0 s"
	}
	return strings.Join(parts, " ")
}

// form is the page's Approve or Deny.
func (h *handler) form(w http.ResponseWriter, r *http.Request) {
	if err := h.cop.Check(r); err != nil {
		h.pageRefuse(w, r, fmt.Errorf("%w: %w", errCrossOrigin, err), "", "")
		return
	}
	id := r.PathValue("id")
	a, err := h.cookie(r)
	if err != nil {
		h.pageRefuse(w, r, err, "", id)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		h.pageRefuse(w, r, fmt.Errorf("%w: %w", errBadRequest, err), a.ID, id)
		return
	}
	if !ValidID(id) {
		h.pageRefuse(w, r, ErrNotFound, a.ID, "")
		return
	}
	if !h.csrfValid(r.PostFormValue("csrf"), a.ID, id, h.s.c.Now()) {
		h.log.Warn().Str("approver", a.ID).Str("approval", id).Msg("approval form without a valid CSRF token")
		h.pageRefuse(w, r, errCSRF, a.ID, id)
		return
	}
	var approve bool
	switch r.PostFormValue("action") {
	case "approve":
		approve = true
	case "deny":
	default:
		h.pageRefuse(w, r, fmt.Errorf("%w: no action", errBadRequest), a.ID, id)
		return
	}
	reason := r.PostFormValue("reason")
	if len(reason) > maxReason {
		h.pageRefuse(w, r, fmt.Errorf("%w: the reason is longer than %d bytes", errBadRequest, maxReason), a.ID, id)
		return
	}
	if _, err := h.decide(a, id, approve, reason); err != nil {
		h.pageRefuse(w, r, err, a.ID, id)
		return
	}
	http.Redirect(w, r, "/approvals/"+id, http.StatusSeeOther)
}

// login is the sign-in form's POST.
func (h *handler) login(w http.ResponseWriter, r *http.Request) {
	if err := h.cop.Check(r); err != nil {
		h.pageRefuse(w, r, fmt.Errorf("%w: %w", errCrossOrigin, err), "", "")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		h.pageRefuse(w, r, fmt.Errorf("%w: %w", errBadRequest, err), "", "")
		return
	}
	next := r.PostFormValue("next")
	tok := r.PostFormValue("token")
	a, err := h.auth.Authenticate(r.Context(), tok)
	if err != nil {
		h.pageRefuse(w, r, err, "", next)
		return
	}
	h.setCookie(w, tok)
	if !ValidID(next) {
		h.render(w, http.StatusOK, messagePage, pageData{Title: "Signed in", Approver: a.ID,
			Message: "Open an approval link to decide a request."})
		return
	}
	http.Redirect(w, r, "/approvals/"+next, http.StatusSeeOther)
}
