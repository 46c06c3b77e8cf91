package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// rewriting replaces old with new in everything a handler writes: a
// server on another SDK, which writes what the Go SDK would not.
type rewriting struct {
	http.ResponseWriter
	old, new []byte
}

func (w rewriting) Write(b []byte) (int, error) {
	if _, err := w.ResponseWriter.Write(bytes.ReplaceAll(b, w.old, w.new)); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (w rewriting) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

// capsnap's view holds each tool as the server wrote it: annotations that
// leave out a hint the Go SDK always writes, and a member mcp.Tool has no
// field for, change the digest an agent is delivered, so they must change
// the digest capsnap confirms it at. Re-encoding the SDK's decoding would
// pin another digest, and every such tool would be withheld from agents.
func TestMCPSourceKeepsTheBytesTheServerSent(t *testing.T) {
	lookup := tool("lookup_order", "Look an order up.")
	lookup.Annotations = &mcp.ToolAnnotations{ReadOnlyHint: true}
	goWrites, err := json.Marshal(lookup.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	sent := []byte(`{"readOnlyHint":true,"x-vendor-hint":"prefer this tool"}`)
	if bytes.Equal(goWrites, sent) {
		t.Fatal("the Go SDK writes the annotations as the other server does: nothing to test")
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "other-sdk", Version: "1"}, nil)
	srv.AddTool(lookup, noop)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(rewriting{w, goWrites, sent}, r)
	})}
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { _ = hs.Close() })

	goDef, err := json.Marshal(lookup)
	if err != nil {
		t.Fatal(err)
	}
	want := digest(t, bytes.ReplaceAll(goDef, goWrites, sent))
	for _, version := range []string{"2025-06-18", "2025-11-25"} {
		t.Run(version, func(t *testing.T) {
			_, changes, _ := watch(t, source("http://"+l.Addr().String()+"/mcp", version))
			got := nextChange(t, changes).next.Tools["lookup_order"]
			if got.Digest != want {
				t.Fatalf("capsnap's view has lookup_order at %s, the server sent it at %s (the Go SDK's re-encoding is %s)", got.Digest, want, digest(t, goDef))
			}
			if !bytes.Contains(got.Definition, []byte(`"x-vendor-hint":"prefer this tool"`)) {
				t.Errorf("the canonical definition lost a member the server sent: %s", got.Definition)
			}
		})
	}
}

func TestCompleteEvents(t *testing.T) {
	for _, tt := range []struct{ ct, in, want string }{
		{"application/json", `{"a":1}`, `{"a":1}`},
		{"text/event-stream", "data: a\n\ndata: b", "data: a\n\n"},
		{"text/event-stream; charset=utf-8", "id: 1\r\ndata: a\r\n\r\ndata: b\r\n", "id: 1\r\ndata: a\r\n\r\n"},
		{"text/event-stream", "data: a\n\n", "data: a\n\n"},
		{"text/event-stream", "data: a", "data: a"},
	} {
		if got := string(completeEvents(tt.ct, []byte(tt.in))); got != tt.want {
			t.Errorf("completeEvents(%q, %q) = %q, want %q", tt.ct, tt.in, got, tt.want)
		}
	}
}

// capsnap's session declares the client capabilities it is configured
// with, and only those: servers key tools on them.
func TestMCPSourceDeclaresCapabilities(t *testing.T) {
	for _, tt := range []struct {
		declare                    []string
		sampling, elicitURL, roots bool
	}{
		{[]string{"elicitation", "roots", "sampling"}, true, true, true},
		{[]string{"roots"}, false, false, true},
		{nil, false, false, false},
	} {
		t.Run(fmt.Sprint(tt.declare), func(t *testing.T) {
			declared := make(chan *mcp.ClientCapabilities, 1)
			u := newUpstream(t, nil, tool("lookup_order", "Look an order up."))
			u.srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
				return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
					if p, ok := req.GetParams().(*mcp.InitializeParams); ok {
						select {
						case declared <- p.Capabilities:
						default:
						}
					}
					return next(ctx, method, req)
				}
			})
			u.start(t, "127.0.0.1:0")
			src := source(u.url(), "2025-11-25")
			src.Capabilities = tt.declare
			_, changes, _ := watch(t, src)
			nextChange(t, changes)
			caps := <-declared
			//lint:ignore SA1019 the deprecated capabilities are what is declared
			if got := caps.Sampling != nil; got != tt.sampling {
				t.Errorf("sampling declared %v, want %v", got, tt.sampling)
			}
			if got := caps.Elicitation != nil && caps.Elicitation.URL != nil && caps.Elicitation.Form != nil; got != tt.elicitURL {
				t.Errorf("elicitation (form and url) declared %v, want %v: %+v", got, tt.elicitURL, caps.Elicitation)
			}
			//lint:ignore SA1019 the deprecated capabilities are what is declared
			if got := caps.RootsV2 != nil; got != tt.roots {
				t.Errorf("roots declared %v, want %v", got, tt.roots)
			}
		})
	}
}
