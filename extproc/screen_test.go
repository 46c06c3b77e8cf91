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
			[]string{"R1 data: {\"progress\":1}\n\n", "R1 data: {\"ANSWER\":1}\n\n"}},
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

// A body of a framing clients read differently (or none names) is held
// whole, its headers held back with it, and screened as it grows: what
// cannot name tools passes as it was sent, headers and body, once it ends;
// what could is refused whole as soon as it could (a GET stream never
// ends), the error in the answer's place.
func TestScreenedOtherFraming(t *testing.T) {
	for _, tt := range []struct {
		name, ctype string
		chunks      []string
		trailers    bool
		refused     bool
	}{
		{name: "an HTML 502", ctype: "text/html", chunks: []string{"<p>upstream ", "down</p>"}},
		{name: "no content type, ended by trailers", chunks: []string{"plain ", "text"}, trailers: true},
		{name: "events as text/plain", ctype: "text/plain", chunks: []string{"data: {\"LIST", "ING\":1}\n\n"}, refused: true},
		{name: "a stream that goes on", ctype: "text/plain", chunks: []string{"data: {\"LISTING\":1}\n\n", "data: {}\n\n"}, trailers: true, refused: true},
		{name: "JSON naming an event stream", ctype: `application/json; profile="text/event-stream"`, chunks: []string{`{"LISTING":1}`}, refused: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			s := stream(t, rec)
			head := []string{":status", "200"}
			if tt.ctype != "" {
				head = append(head, "content-type", tt.ctype)
			}
			sendAll(t, s, screenedHeaders(true, false, head...))
			for i, c := range tt.chunks {
				sendAll(t, s, screenedBody(c, i == len(tt.chunks)-1 && !tt.trailers))
			}
			if tt.trailers {
				sendAll(t, s, &extprocv3.ProcessingRequest{MetadataContext: unbound(), Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
			}
			first := recv(t, s)
			if tt.refused {
				ir := first.GetImmediateResponse()
				if ir == nil || ir.GetStatus().GetCode() != 502 || string(ir.GetBody()) != `{"REFUSED":"other"}` {
					t.Fatalf("answer %v, want the whole answer refused", first)
				}
				if rec.passed != 0 {
					t.Errorf("counted as passed too")
				}
				return
			}
			if first.GetResponseHeaders() == nil || first.GetResponseHeaders().GetResponse() != nil {
				t.Fatalf("headers answered %v, want them passed unchanged, after the body was read", first)
			}
			got, end := streamed(t, recv(t, s))
			if got != strings.Join(tt.chunks, "") || end == tt.trailers {
				t.Fatalf("passed %q (end %v)", got, end)
			}
			if tt.trailers && recv(t, s).GetResponseTrailers() == nil {
				t.Fatal("the trailers were not answered")
			}
			if want := strings.Join(tt.chunks, ""); len(rec.screened) == 0 || rec.screened[len(rec.screened)-1] != want || rec.passed != 1 {
				t.Fatalf("screened %q, passed %d: want it screened whole at last, counted as passed", rec.screened, rec.passed)
			}
		})
	}
}

// An event that outgrows the bound before it ends is withheld whole: an
// error event in its place at once, its bytes dropped until the blank line
// that ends it (even one split across chunks, or after CRs), and the
// events after it pass, screened. None of it passes in part.
func TestScreenedOversizedEvent(t *testing.T) {
	big := strings.Repeat("x", 700)
	for _, tt := range []struct {
		name   string
		chunks []string
	}{
		{"ended in a later chunk", []string{"data: {\"ok\":1}\n\ndata: " + big, big, big + "\n", "\nid: 2\ndata: {\"after\":1}\n\n"}},
		{"ended across chunks by CRLF", []string{"data: {\"ok\":1}\n\ndata: " + big, big + "\r", "\n\r", "\nid: 2\ndata: {\"after\":1}\n\n"}},
		{"whole in one chunk", []string{"data: {\"ok\":1}\n\ndata: " + big + big + "\n\nid: 2\ndata: {\"after\":1}\n\n"}},
		{"a line of CR alone is not blank", []string{"data: {\"ok\":1}\n\ndata: " + big + big + "\n\r", "x\n", "\nid: 2\ndata: {\"after\":1}\n\n"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{max: 1024}
			s := stream(t, rec)
			sendAll(t, s, screenedHeaders(true, false, ":status", "200", "content-type", "text/event-stream"))
			recv(t, s)
			for i, c := range tt.chunks {
				sendAll(t, s, screenedBody(c, i == len(tt.chunks)-1))
			}
			passed := passedUntilEnd(t, s)
			want := "data: {\"ok\":1}\n\ndata: {\"OVERSIZED\":1}\n\nid: 2\ndata: {\"after\":1}\n\n"
			if passed != want {
				t.Fatalf("passed %q\nwant %q", passed, want)
			}
			if rec.oversized != 1 || rec.passed != 0 {
				t.Fatalf("oversized %d, passed %d: want it counted once, as withheld", rec.oversized, rec.passed)
			}
		})
	}
}

// passedUntilEnd is what passes on of a streamed body, through the
// answer that ends the stream.
func passedUntilEnd(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient) string {
	t.Helper()
	var passed string
	for {
		body, end := streamed(t, recv(t, s))
		passed += body
		if end {
			return passed
		}
	}
}

// A JSON body that outgrows the bound is withheld whole: none of it
// passes, and once it ends the error takes its place; a body of any
// other framing is refused at once, headers and all.
func TestScreenedOversizedBody(t *testing.T) {
	rec := &recorder{max: 1024}
	s := stream(t, rec)
	sendAll(t, s, screenedHeaders(true, false, ":status", "200", "content-type", "application/json"))
	recv(t, s)
	for _, c := range []string{`{"result":"` + strings.Repeat("x", 1100), strings.Repeat("y", 2000)} {
		sendAll(t, s, screenedBody(c, false))
	}
	sendAll(t, s, screenedBody(`"}`, true))
	if got, end := streamed(t, recv(t, s)); got != `{"OVERSIZED":1}` || !end {
		t.Fatalf("passed %q (end %v)", got, end)
	}

	rec = &recorder{max: 1024}
	s = stream(t, rec)
	sendAll(t, s, screenedHeaders(true, false, ":status", "200", "content-type", "text/plain"), screenedBody(strings.Repeat("z", 1100), false))
	if ir := recv(t, s).GetImmediateResponse(); ir == nil || string(ir.GetBody()) != `{"OVERSIZED":1}` {
		t.Fatalf("answer %v, want the whole answer refused", ir)
	}
	if rec.oversized != 1 || rec.passed != 0 {
		t.Fatalf("oversized %d, passed %d", rec.oversized, rec.passed)
	}
}

// A compressed body cannot be screened: it is refused whole with the
// decision's error, whatever its type.
func TestScreenedCompressedIsRefused(t *testing.T) {
	for _, ctype := range []string{"text/event-stream", "text/html"} {
		rec := &recorder{}
		s := stream(t, rec)
		sendAll(t, s, screenedHeaders(true, false, ":status", "200", "content-type", ctype, "content-encoding", "gzip"))
		ir := recv(t, s).GetImmediateResponse()
		if ir == nil || ir.GetStatus().GetCode() != 502 || len(rec.screened) != 1 {
			t.Fatalf("%s: answer %v, screened %q", ctype, ir, rec.screened)
		}
	}
}

// Every answer is counted once when nothing in it was withheld: at its
// end, or when the stream is cut off (a GET stream the client left).
func TestScreenedPassedIsCounted(t *testing.T) {
	rec := &recorder{}
	s := stream(t, rec)
	sendAll(t, s, screenedHeaders(true, false, ":status", "200", "content-type", "application/json"), screenedBody(`{"id":1,"result":{}}`, true))
	recv(t, s)
	recv(t, s)

	s2 := stream(t, rec)
	sendAll(t, s2, screenedHeaders(true, false, ":status", "200", "content-type", "text/event-stream"), screenedBody("data: {}\n\n", false))
	recv(t, s2)
	recv(t, s2)
	if err := s2.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("the stream ended with %v", err)
	}
	if rec.passed != 2 {
		t.Fatalf("passed counted %d times, want 2", rec.passed)
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

// The answer's head carries the JSON-RPC id the Check left in the
// metadata, which an error written in the answer's place answers; a value
// that is not an id (a number or a string) is not carried.
func TestScreenedAnswerCarriesTheRequestID(t *testing.T) {
	for _, tt := range []struct{ metadata, want string }{
		{`7`, `7`},
		{`"call-1"`, `"call-1"`},
		{`-2.5`, `-2.5`},
		{``, ``},
		{`{"a":1}`, ``},
		{`null`, ``},
		{`7 8`, ``},
	} {
		rec := &recorder{}
		s := stream(t, rec)
		head := screenedHeaders(false, false, ":status", "200", "content-type", "application/json")
		body := screenedBody(`{"jsonrpc":"2.0","id":7,"result":{}}`, true)
		if tt.metadata != "" {
			for _, req := range []*extprocv3.ProcessingRequest{head, body} {
				req.MetadataContext.FilterMetadata[MetadataNamespace].Fields["jsonrpc_id"] = structpb.NewStringValue(tt.metadata)
			}
		}
		sendAll(t, s, head, body)
		recv(t, s)
		recv(t, s)
		if rec.screenedID != tt.want {
			t.Errorf("metadata jsonrpc_id %q: the screened head carries %q, want %q", tt.metadata, rec.screenedID, tt.want)
		}
	}
}
