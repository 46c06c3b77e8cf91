package extproc

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/mcpparse"
)

// observing stands for the decision on a server in observe mode: what
// would be withheld (what says LISTING, what outgrows the bound) is
// counted, and everything passes as it came.
type observing struct {
	recorder
	wouldWithhold int
}

func (o *observing) Screen(_ string, _ decide.ResponseHead, content []byte) decide.Screened {
	n := 0
	if strings.Contains(string(content), "LISTING") {
		n = 1
	}
	o.wouldWithhold += n
	return decide.Screened{Content: content, Withheld: n, Observed: true}
}

func (o *observing) Oversized(string, decide.ResponseHead) decide.Screened {
	o.wouldWithhold++
	return decide.Screened{Withheld: 1, Observed: true}
}

// passedOn is what a screen sends on of chunks, the last ending the body.
func passedOn(t *testing.T, sc *screen, chunks ...string) string {
	t.Helper()
	var got strings.Builder
	for i, c := range chunks {
		resps, last := sc.feed([]byte(c), i == len(chunks)-1, false)
		for _, r := range resps {
			if sr := r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse(); sr != nil {
				got.Write(sr.GetBody())
			}
		}
		if last {
			break
		}
	}
	return got.String()
}

// Observed, an answer of another framing passes whole, held back or not:
// outgrowing the bound passes what was held, headers first, and the rest
// as it comes; a listing in it is counted once, with no screened count on
// top, however many chunks it came in.
func TestObservedOtherFraming(t *testing.T) {
	head := decide.ResponseHead{Status: 200, ContentType: "text/plain"}
	o := &observing{recorder: recorder{max: 8}}
	sc := &screen{d: o, server: "billing", head: head, framing: mcpparse.FramingOther, deferred: true}
	if got, want := passedOn(t, sc, "hello ", "world, ", "this is ", "the end"), "hello world, this is the end"; got != want {
		t.Fatalf("passed %q, want the body whole %q", got, want)
	}
	if o.wouldWithhold != 1 || o.passed != 0 {
		t.Fatalf("counted %d withholdings and %d passes, want the one", o.wouldWithhold, o.passed)
	}

	o = &observing{recorder: recorder{max: 1 << 20}}
	sc = &screen{d: o, server: "billing", head: head, framing: mcpparse.FramingOther, deferred: true}
	if got, want := passedOn(t, sc, "data: LISTING ", "a ", "b ", "c"), "data: LISTING a b c"; got != want {
		t.Fatalf("passed %q, want %q", got, want)
	}
	if o.wouldWithhold != 1 || o.passed != 0 {
		t.Fatalf("one answer counted %d times as a withholding and %d as passed, want once in all", o.wouldWithhold, o.passed)
	}
}

// Observed and buffered, a compressed answer passes as a buffered body
// passes (never as a streamed one, which Envoy takes only in full
// duplex), counted once as what would have been withheld.
func TestObservedCompressedBuffered(t *testing.T) {
	o := &observing{}
	s := stream(t, o)
	if resp := roundTrip(t, s, screenedHeaders(false, false, ":status", "200", "content-type", "application/json", "content-encoding", "gzip")); resp.GetResponseHeaders() == nil {
		t.Fatalf("headers answered %v", resp)
	}
	resp := roundTrip(t, s, screenedBody("\x1f\x8bLISTING", true))
	if resp.GetResponseBody() == nil || resp.GetResponseBody().GetResponse().GetBodyMutation() != nil {
		t.Fatalf("a buffered body answered %v, want it passed unchanged", resp)
	}
	if o.wouldWithhold != 1 || o.passed != 0 {
		t.Fatalf("counted %d withholdings and %d passes", o.wouldWithhold, o.passed)
	}
}

// A JSON body cut off while it was held whole passed nothing: it is
// counted unfinished, not screened.
func TestJSONCutOffIsUnfinished(t *testing.T) {
	r := &recorder{}
	sc := &screen{d: r, server: "billing", head: decide.ResponseHead{Status: 200, ContentType: "application/json"}, framing: mcpparse.FramingJSON}
	if resps, _ := sc.feed([]byte(`{"jsonrpc":"2.0",`), false, false); len(resps) != 0 {
		t.Fatalf("passed part of a JSON body: %v", resps)
	}
	sc.count() // Process's, when the stream is cut off
	if r.passed != 0 || r.unfinished != 1 {
		t.Fatalf("counted passed %d, unfinished %d; want unfinished", r.passed, r.unfinished)
	}
}

// A stream opened with a listing ticket whose answer came with headers
// but no ticket in their metadata (Envoy forwards none) is no abort: it
// is left for the unbound count to show.
func TestNoAbortAfterHeaders(t *testing.T) {
	rec := &recorder{answer: &decide.Delivery{}}
	s, cancel := streamWith(t, rec, "ticket-0")
	sendAll(t, s, screenedHeaders(true, false, ":status", "200", "content-type", "application/json"),
		screenedBody(`{"jsonrpc":"2.0","id":1,"result":{}}`, true))
	recv(t, s)
	recv(t, s)
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	_, _ = s.Recv()
	cancel()
	// Process has returned once the recorder counted the answer.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		rec.mu.Lock()
		aborted, passed := slices.Clone(rec.aborted), rec.passed
		rec.mu.Unlock()
		if passed == 1 {
			if len(aborted) != 0 {
				t.Fatalf("aborted %q for an answer that came back whole", aborted)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the answer was never counted")
		}
	}
}
