package main

import (
	"bytes"
	"fmt"
	"net/http"
	"time"
	"unicode/utf16"
)

// FramingHeader selects, for a request that carries it, a framing that MCP
// clients read differently (issue 35), in which the fixture sends the
// SDK's own tools/list answer, as a hostile server would, to make capsnap
// read it one way and a client another:
//
//	json-profile  application/json; profile="text/event-stream", a JSON body
//	json-both     application/json, text/event-stream (the Accept header's
//	              value copied), a JSON body
//	sse-utf16     text/event-stream; charset=utf-16le, the events in UTF-16
//	sse-plain     text/plain, an event stream
//	sse-none      no Content-Type at all, an event stream
//
// On a POST of tools/list, the answer is sent so; with x-fixture-misroute:
// get-stream, the session's GET stream is (the hijacked listing on it).
const FramingHeader = "x-fixture-framing"

// AbortHeader, on a POST of tools/list, makes the fixture abort its
// answer mid-body, as a server that crashes mid-listing does: the status
// and half of the SDK's JSON answer go out, then the connection is reset,
// at once or, with the value "stall", a moment later.
const AbortHeader = "x-fixture-abort"

// abortAfter is how long an aborted answer stalls mid-body before the
// reset.
const abortAfter = 300 * time.Millisecond

// framing is one of FramingHeader's values: the Content-Type it sends
// (nil: none) and how it writes a JSON-RPC message as the body.
type framing struct {
	contentType []string
	encode      func(msg []byte, eventID string) []byte
}

var framings = map[string]framing{
	"json-profile": {[]string{`application/json; profile="text/event-stream"`}, asJSON},
	"json-both":    {[]string{"application/json, text/event-stream"}, asJSON},
	"sse-utf16":    {[]string{"text/event-stream; charset=utf-16le"}, func(msg []byte, id string) []byte { return utf16LE(asEvent(msg, id)) }},
	"sse-plain":    {[]string{"text/plain"}, asEvent},
	"sse-none":     {nil, asEvent},
}

// The framings a server sends when no test asks for another.
var (
	plainEvents = framing{[]string{"text/event-stream"}, asEvent}
	plainJSON   = framing{[]string{"application/json"}, asJSON}
)

// framingOf is r's framing, if it asks for one, or else or; an unknown
// one is an error.
func framingOf(r *http.Request, or *framing) (*framing, error) {
	v := r.Header.Get(FramingHeader)
	if v == "" {
		return or, nil
	}
	f, ok := framings[v]
	if !ok {
		return nil, fmt.Errorf("unknown %s %q", FramingHeader, v)
	}
	return &f, nil
}

// header sets w's Content-Type to f's, or to none: net/http sniffs one
// for a header that is missing, but not for one set to nil.
func (f *framing) header(w http.ResponseWriter) {
	w.Header()["Content-Type"] = f.contentType
}

func asJSON(msg []byte, _ string) []byte { return msg }

func asEvent(msg []byte, id string) []byte {
	var b bytes.Buffer
	if id != "" {
		fmt.Fprintf(&b, "id: %s\n", id)
	}
	fmt.Fprintf(&b, "event: message\ndata: %s\n\n", msg)
	return b.Bytes()
}

func utf16LE(b []byte) []byte {
	var out []byte
	for _, u := range utf16.Encode([]rune(string(b))) {
		out = append(out, byte(u), byte(u>>8))
	}
	return out
}

// framingGate answers a POST of tools/list that carries FramingHeader (and
// no x-fixture-misroute, which puts the listing elsewhere) with the SDK's
// own answer in that framing, and passes every other request to next.
func framingGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := framingOf(r, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		abort := r.Header.Get(AbortHeader) != ""
		if (f == nil && !abort) || r.Method != http.MethodPost || r.Header.Get(MisrouteHeader) != "" {
			next.ServeHTTP(w, r)
			return
		}
		_, method, ok := peek(w, r)
		if !ok {
			return
		}
		if method != "tools/list" {
			next.ServeHTTP(w, r)
			return
		}
		answer, rec, err := sdkAnswer(next, r)
		if err != nil {
			http.Error(w, "framing: "+err.Error(), http.StatusInternalServerError)
			return
		}
		for k, v := range rec.Header() {
			if k != "Content-Type" && k != "Content-Length" {
				w.Header()[k] = v
			}
		}
		if abort {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			w.Write(answer[:len(answer)/2])
			http.NewResponseController(w).Flush()
			// As a server that dies while it writes a long list: the
			// proxy has the status and part of the body by then. Without
			// the stall, the reset races them through the proxy.
			if r.Header.Get(AbortHeader) == "stall" {
				time.Sleep(abortAfter)
			}
			// net/http resets the connection, sending no more.
			panic(http.ErrAbortHandler)
		}
		f.header(w)
		w.WriteHeader(http.StatusOK)
		w.Write(f.encode(answer, ""))
	})
}
