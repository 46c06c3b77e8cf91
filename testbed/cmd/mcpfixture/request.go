package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
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
