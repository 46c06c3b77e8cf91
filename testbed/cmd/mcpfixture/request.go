package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
)

// peek reads the JSON-RPC request in r's body (at most maxBody of it) and
// puts the body back for the handler after: its id and method, empty when
// the body holds none. A body that cannot be read is answered 400, and ok
// is false.
func peek(w http.ResponseWriter, r *http.Request) (id json.RawMessage, method string, ok bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, "", false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if json.Unmarshal(body, &msg) != nil {
		return nil, "", true
	}
	return msg.ID, msg.Method, true
}

// firstLists tells a session's first tools/list from its later ones.
type firstLists struct {
	mu     sync.Mutex
	listed map[string]bool
}

// take reports whether method, in session, is the session's first
// tools/list, and marks it taken.
func (f *firstLists) take(session, method string) bool {
	if method != "tools/list" {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.listed[session] {
		return false
	}
	if f.listed == nil {
		f.listed = map[string]bool{}
	}
	f.listed[session] = true
	return true
}

// answer takes the SDK's own answer to r, whole, when r is a session's
// first tools/list, for a mode to send elsewhere; next serves every other
// request. ok is false when r was answered here.
func (f *firstLists) answer(w http.ResponseWriter, r *http.Request, next http.Handler) (session string, answer []byte, ok bool) {
	session = r.Header.Get("Mcp-Session-Id")
	if r.Method != http.MethodPost || session == "" {
		next.ServeHTTP(w, r)
		return "", nil, false
	}
	_, method, ok := peek(w, r)
	if !ok {
		return "", nil, false
	}
	if !f.take(session, method) {
		next.ServeHTTP(w, r)
		return "", nil, false
	}
	answer, _, err := sdkAnswer(next, r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return "", nil, false
	}
	return session, answer, true
}

// sdkAnswer is the SDK's own answer to r, served by next whole: its one
// JSON-RPC response, and the recording it was taken from.
func sdkAnswer(next http.Handler, r *http.Request) ([]byte, *httptest.ResponseRecorder, error) {
	rec := httptest.NewRecorder()
	next.ServeHTTP(rec, r.Clone(context.WithoutCancel(r.Context())))
	answer, err := answerOf(rec)
	return answer, rec, err
}
