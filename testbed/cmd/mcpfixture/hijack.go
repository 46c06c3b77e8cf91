package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// HijackMode is the x-fixture-misroute value under which a session's first
// tools/list is answered on the session's GET event stream instead of its
// own POST, as a hostile server would: the SDK's own listing for the
// request's id goes out on the GET stream, which the fixture holds for the
// session (the SDK serves every other request), while the POST's event
// stream stays open with no message until a moment after. A client takes
// the listing there for the answer to its pending tools/list (Python's
// would give up on a POST answered 202, so the POST is not). Later
// listings of the session are the SDK's, on their POSTs.
const HijackMode = "get-stream"

// hijacker holds each hijacked session's GET stream and whether its first
// listing has gone.
type hijacker struct {
	next http.Handler

	first   firstLists
	mu      sync.Mutex
	streams map[string]chan []byte
}

func newHijacker(next http.Handler) *hijacker {
	return &hijacker{next: next, streams: map[string]chan []byte{}}
}

// hijackWait bounds how long a listing waits for its session's GET stream,
// which a client opens on its own after initialize.
const hijackWait = 10 * time.Second

func (h *hijacker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if session := r.Header.Get("Mcp-Session-Id"); r.Method == http.MethodGet && session != "" {
		h.stream(w, r, session)
		return
	}
	// The SDK's own answer, taken whole, for the GET stream.
	session, answer, ok := h.first.answer(w, r, h.next)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, ": the answer goes on the GET stream\n\n")
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	h.send(r.Context(), session, answer)
	// The client has it before its POST's stream ends empty.
	time.Sleep(300 * time.Millisecond)
}

// send puts answer on session's GET stream once it is open.
func (h *hijacker) send(ctx context.Context, session string, answer []byte) {
	for deadline := time.Now().Add(hijackWait); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
		h.mu.Lock()
		ch := h.streams[session]
		h.mu.Unlock()
		if ch != nil {
			select {
			case ch <- answer:
			case <-ctx.Done():
			}
			return
		}
	}
}

// stream serves session's GET event stream until the client goes.
func (h *hijacker) stream(w http.ResponseWriter, r *http.Request, session string) {
	ch := make(chan []byte, 1)
	h.mu.Lock()
	h.streams[session] = ch
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		if h.streams[session] == ch {
			delete(h.streams, session)
		}
		h.mu.Unlock()
	}()
	// The stream in a framing a test asks for (FramingHeader), the
	// listing on it too.
	f, err := framingOf(r, &plainEvents)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.header(w)
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	flush()
	for n := 1; ; n++ {
		select {
		case <-r.Context().Done():
			return
		case msg := <-ch:
			w.Write(f.encode(msg, fmt.Sprintf("hijack-%d", n)))
			flush()
		}
	}
}

// answerOf is the one JSON-RPC response in a recorded answer: its JSON
// body, or the data of its event that holds a response.
func answerOf(rec *httptest.ResponseRecorder) ([]byte, error) {
	body := rec.Body.Bytes()
	if !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream") {
		return bytes.TrimSpace(body), nil
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), maxBody)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if ok && (strings.Contains(data, `"result"`) || strings.Contains(data, `"error"`)) {
			return []byte(data), nil
		}
	}
	return nil, fmt.Errorf("no response in the SDK's answer (%d, %q)", rec.Code, body)
}
