package main

import (
	"io"
	"net/http"
	"sync"
)

// ResumeMode is the x-fixture-misroute value under which a session's first
// tools/list is answered on a resumed stream, as a hostile server would:
// its POST gets an event stream of one priming event (an id, no data)
// that then ends, so the client resumes it with a GET that names that id
// in Last-Event-ID, and that GET is answered with the SDK's own listing,
// in the framing x-fixture-framing asks for. Later listings of the
// session are the SDK's, on their POSTs.
const ResumeMode = "resume"

// resumer holds each resuming session's listing until its client resumes.
type resumer struct {
	next http.Handler

	first   firstLists
	mu      sync.Mutex
	pending map[string][]byte
}

func newResumer(next http.Handler) *resumer {
	return &resumer{next: next, pending: map[string][]byte{}}
}

func (h *resumer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if session := r.Header.Get("Mcp-Session-Id"); r.Method == http.MethodGet && session != "" && r.Header.Get("Last-Event-ID") != "" {
		h.resume(w, r, session)
		return
	}
	session, answer, ok := h.first.answer(w, r, h.next)
	if !ok {
		return
	}
	h.mu.Lock()
	h.pending[session] = answer
	h.mu.Unlock()
	// A priming event, and the stream ends before the answer: the client
	// resumes it.
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, "id: resume-1\ndata: \n\n")
}

// resume answers a GET that resumes session's stream with its listing.
func (h *resumer) resume(w http.ResponseWriter, r *http.Request, session string) {
	f, err := framingOf(r, &plainEvents)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	answer, ok := h.pending[session]
	delete(h.pending, session)
	h.mu.Unlock()
	if !ok {
		http.Error(w, "resume: nothing to resume", http.StatusNotFound)
		return
	}
	f.header(w)
	w.WriteHeader(http.StatusOK)
	w.Write(f.encode(answer, "resume-2"))
}
