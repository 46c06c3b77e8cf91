package extproc

import (
	"errors"
	"io"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// unbound is the metadata of an answer that is not a tools/list's own: the
// Check's server_id, and no listing ticket.
func unbound() *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		MetadataNamespace: {Fields: map[string]*structpb.Value{"server_id": structpb.NewStringValue("billing")}},
	}}
}

func screenedHeaders(duplex, eos bool, kv ...string) *extprocv3.ProcessingRequest {
	req := responseHeaders(eos, kv...)
	req.MetadataContext = unbound()
	if duplex {
		req.ProtocolConfig = &extprocv3.ProtocolConfiguration{ResponseBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	}
	return req
}

func screenedBody(body string, eos bool) *extprocv3.ProcessingRequest {
	req := responseBody(body, eos)
	req.MetadataContext = unbound()
	return req
}

// streamed is the body a full-duplex answer sends on, and whether it ends
// the stream.
func streamed(t *testing.T, resp *extprocv3.ProcessingResponse) (string, bool) {
	t.Helper()
	sr := resp.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if sr == nil {
		t.Fatalf("answer %v, want a streamed body", resp)
	}
	return string(sr.GetBody()), sr.GetEndOfStream()
}

// An event stream that is not a tools/list's own passes event by event, as
// each one ends (an event split across chunks waits for its end), each
// screened; the headers are answered at once, unchanged (capsnap's own
// denials pass this way), and nothing is delivered through Deliver.
func TestScreenedEventStream(t *testing.T) {
	rec := &recorder{}
	s := stream(t, rec)
	sendAll(t, s, screenedHeaders(true, false, ":status", "403", "content-type", "text/event-stream", "x-capsnap-reason", "no_snapshot"))
	resp := recv(t, s)
	if resp.GetResponseHeaders() == nil || resp.GetResponseHeaders().GetResponse() != nil {
		t.Fatalf("headers answered %v, want them passed unchanged", resp)
	}
	steps := []struct {
		chunk string
		end   bool
		want  string // what passes on; "" for nothing yet
	}{
		{"data: {\"progress\":1}\n\n", false, "data: {\"progress\":1}\n\n"},
		{"data: {\"LIST", false, ""},
		{"ING\":1}\r\n", false, ""},
		{"\r\nid: 3\ndata: {", false, "data: {\"WITHHELD\":1}\r\n\r\n"},
		{"\"done\":1}\n\n", true, "id: 3\ndata: {\"done\":1}\n\n"},
	}
	for i, st := range steps {
		sendAll(t, s, screenedBody(st.chunk, st.end))
		if st.want == "" {
			continue
		}
		got, end := streamed(t, recv(t, s))
		if got != st.want || end != st.end {
			t.Fatalf("step %d: passed %q (end %v), want %q (end %v)", i, got, end, st.want, st.end)
		}
	}
	if rec.calls != 0 || rec.server != "billing" || len(rec.screened) != 3 {
		t.Fatalf("%d deliveries, server %q, screened %q", rec.calls, rec.server, rec.screened)
	}
}

// With a release ticket in the metadata, an answer's content goes to Settle
// as the server sent it, event by event until the call's response is
// found, and no further; without one, Settle is never asked.
func TestSettle(t *testing.T) {
	withRelease := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingRequest {
		req.MetadataContext.FilterMetadata[MetadataNamespace].Fields["release"] = structpb.NewStringValue("R1")
		return req
	}
	for _, tt := range []struct {
		name    string
		ticket  bool
		duplex  bool
		ctype   string
		chunks  []string
		settled []string
	}{
		{"events until the answer", true, true, "text/event-stream",
			[]string{"data: {\"progress\":1}\n\n", "data: {\"ANSWER\":1}\n\ndata: {\"after\":1}\n\n", "data: {\"more\":1}\n\n"},
			[]string{"R1 data: {\"progress\":1}\n\n", "R1 data: {\"ANSWER\":1}\n\ndata: {\"after\":1}\n\n"}},
		{"a JSON body, whole", true, true, "application/json", []string{`{"id":1,`, `"ANSWER":1}`}, []string{`R1 {"id":1,"ANSWER":1}`}},
		{"buffered", true, false, "application/json", []string{`{"ANSWER":1}`}, []string{`R1 {"ANSWER":1}`}},
		{"no ticket", false, true, "application/json", []string{`{"ANSWER":1}`}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			s := stream(t, rec)
			headers := screenedHeaders(tt.duplex, false, ":status", "200", "content-type", tt.ctype)
			if tt.ticket {
				headers = withRelease(headers)
			}
			if !tt.duplex {
				// Envoy sends the metadata with every message.
				roundTrip(t, s, headers)
				roundTrip(t, s, withRelease(screenedBody(tt.chunks[0], true)))
			} else {
				sendAll(t, s, headers)
				recv(t, s)
				for i, c := range tt.chunks {
					last := i == len(tt.chunks)-1
					sendAll(t, s, screenedBody(c, last))
					if tt.ctype == "text/event-stream" || last {
						recv(t, s)
					}
				}
			}
			if strings.Join(rec.settled, "|") != strings.Join(tt.settled, "|") {
				t.Errorf("settled %q, want %q", rec.settled, tt.settled)
			}
		})
	}
}

// A JSON body is screened whole, once it ends.
func TestScreenedJSONBody(t *testing.T) {
	rec := &recorder{}
	s := stream(t, rec)
	sendAll(t, s, screenedHeaders(true, false, ":status", "200", "content-type", "application/json"),
		screenedBody(`{"id":1,"result":{"LIST`, false), screenedBody(`ING":[]}}`, true))
	recv(t, s) // the headers'
	if got, end := streamed(t, recv(t, s)); got != `{"id":1,"result":{"WITHHELD":[]}}` || !end {
		t.Fatalf("passed %q (end %v)", got, end)
	}
	if len(rec.screened) != 1 {
		t.Fatalf("screened %q, want the body once, whole", rec.screened)
	}
}

// A body no client reads as JSON-RPC passes as it comes, unscreened.
func TestScreenedOtherBodyPasses(t *testing.T) {
	rec := &recorder{}
	s := stream(t, rec)
	sendAll(t, s, screenedHeaders(true, false, ":status", "502", "content-type", "text/html"), screenedBody("<p>LISTING", false))
	recv(t, s)
	if got, _ := streamed(t, recv(t, s)); got != "<p>LISTING" {
		t.Fatalf("passed %q", got)
	}
	sendAll(t, s, screenedBody("</p>", true))
	if got, end := streamed(t, recv(t, s)); got != "</p>" || !end {
		t.Fatalf("passed %q (end %v)", got, end)
	}
	if len(rec.screened) != 0 {
		t.Fatalf("screened %q", rec.screened)
	}
}

// Held bytes past the bound that cannot name tools pass, and so does what
// follows while it cannot; the first chunk that could (even a name begun
// in the chunk before) ends the stream with an error, so that what the
// client has is no whole message.
func TestScreenedOverTheBound(t *testing.T) {
	for _, tt := range []struct {
		name   string
		chunks []string
	}{
		{"names tools past the bound", []string{strings.Repeat("x", 1100), "y", `"tools"`}},
		{"a name across chunks", []string{strings.Repeat("x", 1100) + `"to`, `ols"`}},
		{"a folded name", []string{strings.Repeat("x", 1100), "\"tool\u017f\""}},
		{"a name a byte a chunk", []string{strings.Repeat("x", 1100), `"`, "t", "o", "o", "l", "s", `"`}},
		{"tools within the held bytes", []string{`{"tools":` + strings.Repeat("x", 1100)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := stream(t, &recorder{max: 1024})
			sendAll(t, s, screenedHeaders(true, false, ":status", "200", "content-type", "application/json"))
			recv(t, s)
			// The body ends, so that a stream never cut off ends too. A
			// stream cut off before the last chunk is sent refuses it (io.EOF);
			// why is for Recv to say.
			for i, c := range append(tt.chunks, "") {
				if err := s.Send(screenedBody(c, i == len(tt.chunks))); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Fatal(err)
				}
			}
			var passed string
			for {
				resp, err := s.Recv()
				if err != nil {
					if status.Code(err) != codes.PermissionDenied {
						t.Fatalf("stream ended with %v, want PermissionDenied", err)
					}
					break
				}
				body, end := streamed(t, resp)
				passed += body
				if end {
					t.Fatalf("the stream ended uncut, having passed %q", passed)
				}
			}
			if strings.Contains(passed, "tools") || strings.Contains(passed, "tool\u017f") || strings.Contains(passed, `"to`+`ols`) {
				t.Fatalf("passed %q", passed)
			}
		})
	}
}

// A compressed body a client would read as JSON-RPC cannot be screened: it
// is refused whole with the decision's error.
func TestScreenedCompressedIsRefused(t *testing.T) {
	rec := &recorder{}
	s := stream(t, rec)
	sendAll(t, s, screenedHeaders(true, false, ":status", "200", "content-type", "text/event-stream", "content-encoding", "gzip"))
	ir := recv(t, s).GetImmediateResponse()
	if ir == nil || ir.GetStatus().GetCode() != 502 || len(rec.screened) != 1 {
		t.Fatalf("answer %v, screened %q", ir, rec.screened)
	}
}

// A bodyless answer is answered at its headers, and nothing is screened.
func TestScreenedBodyless(t *testing.T) {
	rec := &recorder{}
	s := stream(t, rec)
	if resp := roundTrip(t, s, screenedHeaders(true, true, ":status", "202")); resp.GetResponseHeaders() == nil || len(rec.screened) != 0 {
		t.Fatalf("answer %v, screened %q", resp, rec.screened)
	}
}

// Buffered by Envoy, the body is screened whole, and a changed one goes
// with its new length; a body in parts cannot be, and fails closed.
func TestScreenedBuffered(t *testing.T) {
	rec := &recorder{}
	s := stream(t, rec)
	if resp := roundTrip(t, s, screenedHeaders(false, false, ":status", "200", "content-type", "application/json")); resp.GetResponseHeaders() == nil {
		t.Fatalf("answer %v", resp)
	}
	resp := roundTrip(t, s, screenedBody(`{"LISTING":1}`, true))
	common := resp.GetResponseBody().GetResponse()
	if string(common.GetBodyMutation().GetBody()) != `{"WITHHELD":1}` || setHeaders(common.GetHeaderMutation())["content-length"] != "14" {
		t.Fatalf("answer %v", resp)
	}

	s = stream(t, &recorder{})
	roundTrip(t, s, screenedHeaders(false, false, ":status", "200", "content-type", "application/json"))
	sendAll(t, s, screenedBody(`{"a":`, false))
	if _, err := s.Recv(); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a body in parts: %v, want FailedPrecondition", err)
	}
}

// A trailer ends a screened body: what was held is screened and passes.
func TestScreenedBodyEndedByTrailers(t *testing.T) {
	s := stream(t, &recorder{})
	sendAll(t, s, screenedHeaders(true, false, ":status", "200", "content-type", "application/json"),
		screenedBody(`{"LISTING":1}`, false),
		&extprocv3.ProcessingRequest{MetadataContext: unbound(), Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
	recv(t, s)
	if got, end := streamed(t, recv(t, s)); got != `{"WITHHELD":1}` || end {
		t.Fatalf("passed %q (end %v), want the screened body, not ending the stream", got, end)
	}
	if recv(t, s).GetResponseTrailers() == nil {
		t.Fatal("the trailers were not answered")
	}
}
