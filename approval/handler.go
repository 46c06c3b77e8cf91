package approval

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// The approval listener: the page a person approves or denies a request
// on, and the JSON API the CLI speaks.
//
//	GET  /approvals/{id}                  the request's page (browser)
//	POST /approvals/{id}                  approve or deny it (the page's form)
//	POST /approvals/login                 sign in with a token (the page's form)
//	GET  /api/approvals                   the requests the caller may decide
//	GET  /api/approvals/{id}              one request
//	POST /api/approvals/{id}/approve      approve it
//	POST /api/approvals/{id}/deny         deny it
//
// The browser presents its token once, as ?token= on the page's URL or in
// the sign-in form, and holds it in an HttpOnly, SameSite=Strict cookie
// scoped to /approvals; the API takes it only as Authorization: Bearer and
// never reads the cookie, so no other site can make a browser call it.
// The token is verified on every request, so its expiry ends the session.
//
// A form's POST is refused unless it is same-origin by the browser's own
// account (net/http's CrossOriginProtection, on Sec-Fetch-Site or Origin)
// and carries the CSRF token the page was rendered with: an HMAC over the
// approver's identity, the request id and the time, valid for an hour.
// Either alone would do for today's browsers; the token also holds for a
// browser that sends neither header, and binds the form to the approver
// and the request it was shown for.

// HandlerOptions configure NewHandler.
type HandlerOptions struct {
	Service *Service
	Auth    Authenticator
	// CSRFKey keys the forms' CSRF tokens: replicas behind one URL share
	// it (derive it from their shared secret). Nil: a random key of this
	// process's own, which does for one replica.
	CSRFKey []byte
	// Log gets the refusals worth an operator's eye (forged tokens, CSRF).
	Log zerolog.Logger
}

// cookieName holds the approver's token in the browser.
const cookieName = "capsnap_approver"

// csrfTTL is how long a rendered page's form can be posted.
const csrfTTL = time.Hour

// maxForm bounds a form's or an API call's body; a reason is at most
// maxReason bytes.
const (
	maxForm   = 64 << 10
	maxReason = 1000
)

type handler struct {
	s       *Service
	auth    Authenticator
	csrfKey []byte
	cop     *http.CrossOriginProtection
	dev     bool
	log     zerolog.Logger
}

// NewHandler returns the approval listener's handler.
func NewHandler(o HandlerOptions) (http.Handler, error) {
	if o.Service == nil || o.Auth == nil {
		return nil, errors.New("approval: the handler needs a service and an authenticator")
	}
	key := o.CSRFKey
	if key == nil {
		key = make([]byte, 32)
		_, _ = rand.Read(key) // crypto/rand.Read never fails on supported platforms
	}
	dev, _ := o.Auth.(interface{ Development() bool })
	h := &handler{s: o.Service, auth: o.Auth, csrfKey: key, cop: http.NewCrossOriginProtection(),
		dev: dev != nil && dev.Development(), log: o.Log}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /approvals/{id}", h.page)
	mux.HandleFunc("POST /approvals/{id}", h.form)
	mux.HandleFunc("POST /approvals/login", h.login)
	mux.HandleFunc("GET /api/approvals", h.apiList)
	mux.HandleFunc("GET /api/approvals/{id}", h.apiGet)
	mux.HandleFunc("POST /api/approvals/{id}/{action}", h.apiDecide)
	return secured(mux), nil
}

// secured sets the headers every answer carries: nothing is cached,
// framed, sniffed or sent on as a referrer, and a page runs no script and
// loads nothing but its own inline style.
func secured(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Cache-Control", "no-store")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Content-Security-Policy", "default-src 'none'; style-src '"+styleHash+"'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		next.ServeHTTP(w, r)
	})
}

// refusal is one way the listener refuses a request: its status and its
// stable code, the "error.code" of the API's JSON body and the label of
// capsnap_approvals_refused_total.
type refusal struct {
	err     error
	status  int
	code    string
	title   string
	message string
}

// apiErrors are every refusal. One whose err is a store's or an
// authenticator's is the answer to that error; the last is the answer to
// any other error, a store that cannot answer: nothing is ever approved
// without it.
var apiErrors = []refusal{
	{ErrUnauthenticated, http.StatusUnauthorized, "unauthenticated", "Sign in to decide", "A valid approver token is required."},
	{ErrNotApprover, http.StatusForbidden, "not_an_approver", "Not yours to decide", "You are not one of this request's approvers."},
	{ErrSelfApproval, http.StatusForbidden, "self_approval", "Not yours to approve", "The requesting principal may not approve its own call."},
	{ErrNotFound, http.StatusNotFound, "not_found", "No such request", "There is no such approval request."},
	{ErrDecided, http.StatusConflict, "already_decided", "Already decided", "The request is already decided."},
	{ErrExpired, http.StatusGone, "expired", "Expired", "The request has expired; the agent's next call asks again."},
	{errCSRF, http.StatusForbidden, "csrf", "Form expired or forged", "The form's CSRF token is missing or invalid: open the request again and decide."},
	{errCrossOrigin, http.StatusForbidden, "cross_origin", "Refused", "A form from another origin is refused."},
	{errBadRequest, http.StatusBadRequest, "bad_request", "Malformed request", "The request is malformed."},
	{nil, http.StatusServiceUnavailable, "store_unavailable", "Try again shortly", "The approval store cannot answer now; nothing was decided."},
}

var (
	errCSRF        = errors.New("approval: missing or invalid CSRF token")
	errCrossOrigin = errors.New("approval: cross-origin request")
	errBadRequest  = errors.New("approval: malformed request")
)

func refusalOf(err error) refusal {
	for _, r := range apiErrors[:len(apiErrors)-1] {
		if errors.Is(err, r.err) {
			return r
		}
	}
	return apiErrors[len(apiErrors)-1]
}

// refused counts and logs err's refusal and returns it.
func (h *handler) refused(r *http.Request, err error) refusal {
	ref := refusalOf(err)
	h.s.metrics.refused.WithLabelValues(ref.code).Inc()
	ev := h.log.Info()
	if ref.status >= 500 {
		ev = h.log.Error()
	}
	ev.Err(err).Str("code", ref.code).Str("method", r.Method).Str("path", r.URL.Path).Msg("approval request refused")
	return ref
}

// bearer is the bearer token of an API call; the cookie is never read.
func bearer(r *http.Request) string {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// View is a request as the API answers it: the request and its page.
type View struct {
	Request
	URL string `json:"url"`
}

// APIError is the API's answer to a call it refuses, in its JSON body
// under "error".
type APIError struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s: %s (HTTP %d)", e.Code, e.Message, e.Status)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		status, b = http.StatusInternalServerError, *bytes.NewBufferString(`{"error":{"code":"internal","message":"encoding failed"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func (h *handler) apiRefuse(w http.ResponseWriter, r *http.Request, err error) {
	ref := h.refused(r, err)
	if ref.status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="capsnap approvals"`)
	}
	writeJSON(w, ref.status, map[string]APIError{"error": {Code: ref.code, Message: ref.message}})
}

// apiApprover authenticates an API call.
func (h *handler) apiApprover(w http.ResponseWriter, r *http.Request) (Approver, bool) {
	a, err := h.auth.Authenticate(r.Context(), bearer(r))
	if err != nil {
		h.apiRefuse(w, r, err)
		return Approver{}, false
	}
	return a, true
}

// visible returns request id if a may see it: one of its approvers.
func (h *handler) visible(a Approver, id string) (Request, error) {
	req, err := h.s.Get(id)
	if err != nil {
		return Request{}, err
	}
	if !a.May(req) {
		return Request{}, ErrNotApprover
	}
	return req, nil
}

func (h *handler) apiList(w http.ResponseWriter, r *http.Request) {
	a, ok := h.apiApprover(w, r)
	if !ok {
		return
	}
	f := Filter{State: State(r.URL.Query().Get("state")), Principal: r.URL.Query().Get("principal")}
	if f.State != "" && !f.State.valid() {
		h.apiRefuse(w, r, fmt.Errorf("%w: unknown state %q", errBadRequest, f.State))
		return
	}
	all, err := h.s.List(f)
	if err != nil {
		h.apiRefuse(w, r, err)
		return
	}
	views := []View{}
	for _, req := range all {
		if a.May(req) {
			views = append(views, View{req, h.s.URL(req.ID)})
		}
	}
	writeJSON(w, http.StatusOK, map[string][]View{"approvals": views})
}

func (h *handler) apiGet(w http.ResponseWriter, r *http.Request) {
	a, ok := h.apiApprover(w, r)
	if !ok {
		return
	}
	req, err := h.visible(a, r.PathValue("id"))
	if err != nil {
		h.apiRefuse(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, View{req, h.s.URL(req.ID)})
}

// DecideBody is the optional body of an API decision.
type DecideBody struct {
	Reason string `json:"reason,omitempty"`
}

func (h *handler) apiDecide(w http.ResponseWriter, r *http.Request) {
	var approve bool
	switch r.PathValue("action") {
	case "approve":
		approve = true
	case "deny":
	default:
		h.apiRefuse(w, r, ErrNotFound)
		return
	}
	a, ok := h.apiApprover(w, r)
	if !ok {
		return
	}
	var body DecideBody
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxForm))
	if err == nil && len(bytes.TrimSpace(data)) > 0 {
		err = json.Unmarshal(data, &body)
	}
	if err == nil && len(body.Reason) > maxReason {
		err = fmt.Errorf("the reason is longer than %d bytes", maxReason)
	}
	if err != nil {
		h.apiRefuse(w, r, fmt.Errorf("%w: %w", errBadRequest, err))
		return
	}
	req, err := h.decide(a, r.PathValue("id"), approve, body.Reason)
	if err != nil {
		h.apiRefuse(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, View{req, h.s.URL(req.ID)})
}

// decide decides request id as a, who must be allowed to see it first, so
// that a stranger learns nothing of a request from the answer.
func (h *handler) decide(a Approver, id string, approve bool, reason string) (Request, error) {
	if _, err := h.visible(a, id); err != nil {
		return Request{}, err
	}
	return h.s.Decide(id, a, approve, reason)
}

// csrfToken is the form's token for approver and request id, made at at:
// "<unix seconds>.<mac>".
func (h *handler) csrfToken(approver, id string, at time.Time) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	return ts + "." + h.csrfMAC(approver, id, ts)
}

func (h *handler) csrfMAC(parts ...string) string {
	m := hmac.New(sha256.New, h.csrfKey)
	var n [binary.MaxVarintLen64]byte
	for _, p := range append([]string{"capsnap approval form"}, parts...) {
		m.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		m.Write([]byte(p))
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
}

func (h *handler) csrfValid(tok, approver, id string, now time.Time) bool {
	ts, mac, ok := strings.Cut(tok, ".")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if !ok || err != nil {
		return false
	}
	if age := now.Sub(time.Unix(sec, 0)); age < -time.Minute || age > csrfTTL {
		return false
	}
	return hmac.Equal([]byte(mac), []byte(h.csrfMAC(approver, id, ts)))
}
