package extproc

import (
	"context"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	grpcmd "google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/testbed"
)

// recorder is a Decider that answers with a fixed delivery and remembers
// what it was asked.
type recorder struct {
	answer *decide.Delivery
	ticket string
	head   decide.ResponseHead
	body   []byte
	calls  int
	// max is MaxResponseBytes; zero means 1 MiB.
	max int
	// screened is what Screen was given, one entry a call, and server
	// the server it was given.
	screened []string
	server   string
	// screenedID is the request id the last Screen's head carried.
	screenedID string
	// settled is what Settle was given, one entry a call, with its
	// ticket; Settle finds the response in content that says ANSWER.
	settled []string
	// elicits are the sessions Elicits was told of.
	elicits []string
	// oversized and passed count Oversized's and Passed's calls, and
	// aborted are the tickets Aborted was told of.
	oversized, passed, unfinished int
	// mu guards aborted, which the server's goroutine appends to once
	// the stream has ended.
	mu      sync.Mutex
	aborted []string
}

func (r *recorder) Elicits(session string) { r.elicits = append(r.elicits, session) }

func (r *recorder) Settle(ticket string, _ decide.ResponseHead, content []byte) bool {
	r.settled = append(r.settled, ticket+" "+string(content))
	return strings.Contains(string(content), "ANSWER")
}

// Screen stands for the decision on an answer that is not a tools/list's
// own: it withholds whatever says LISTING, as decide.Server.Screen
// withholds a listing.
func (r *recorder) Screen(server string, head decide.ResponseHead, content []byte) decide.Screened {
	r.screened = append(r.screened, string(content))
	r.server, r.screenedID = server, string(head.ID)
	switch {
	case mcpparse.Encoded(head.ContentEncoding):
		return decide.Screened{Content: []byte(`{"REFUSED":"encoded"}`), Withheld: 1, Whole: true}
	case !strings.Contains(string(content), "LISTING"):
		return decide.Screened{Content: content}
	case mcpparse.FramingOf(head.ContentType) == mcpparse.FramingOther:
		return decide.Screened{Content: []byte(`{"REFUSED":"other"}`), Withheld: 1, Whole: true}
	}
	return decide.Screened{Content: []byte(strings.ReplaceAll(string(content), "LISTING", "WITHHELD")), Withheld: 1}
}

// Oversized stands for withholding what outgrew the bound: an OVERSIZED
// event, body, or whole answer, by the framing.
func (r *recorder) Oversized(server string, head decide.ResponseHead) decide.Screened {
	r.oversized++
	switch mcpparse.FramingOf(head.ContentType) {
	case mcpparse.FramingSSE:
		return decide.Screened{Content: []byte("data: {\"OVERSIZED\":1}\n\n"), Withheld: 1}
	case mcpparse.FramingJSON:
		return decide.Screened{Content: []byte(`{"OVERSIZED":1}`), Withheld: 1}
	}
	return decide.Screened{Content: []byte(`{"OVERSIZED":1}`), Withheld: 1, Whole: true}
}

func (r *recorder) Passed(server string, whole bool) {
	if whole {
		r.passed++
	} else {
		r.unfinished++
	}
}

func (r *recorder) Aborted(ticket string, head decide.ResponseHead) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.aborted = append(r.aborted, ticket)
}

func (r *recorder) Deliver(ticket string, head decide.ResponseHead, body []byte) *decide.Delivery {
	r.ticket, r.head, r.body = ticket, head, body
	r.calls++
	return r.answer
}

func (r *recorder) MaxResponseBytes() int {
	if r.max == 0 {
		return 1 << 20
	}
	return r.max
}

// stream opens one ext_proc stream to a Server over d, through gRPC.
func stream(t *testing.T, d Decider) extprocv3.ExternalProcessor_ProcessClient {
	t.Helper()
	s, _ := streamWith(t, d, "")
	return s
}

// streamWith opens one ext_proc stream as Envoy opens it with a listing
// ticket in its gRPC metadata (ListingMetadata), if ticket is set; cancel
// ends it as Envoy does.
func streamWith(t *testing.T, d Decider, ticket string) (extprocv3.ExternalProcessor_ProcessClient, context.CancelFunc) {
	t.Helper()
	conn := testbed.InMemoryGRPC(t, func(gs *grpc.Server) { extprocv3.RegisterExternalProcessorServer(gs, New(d, nil)) })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if ticket != "" {
		ctx = grpcmd.AppendToOutgoingContext(ctx, ListingMetadata, ticket)
	}
	s, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s, cancel
}

func metadata(ticket string) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		MetadataNamespace: {Fields: map[string]*structpb.Value{"listing": structpb.NewStringValue(ticket)}},
	}}
}

func responseHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	hm := &corev3.HeaderMap{}
	for i := 0; i < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.ProcessingRequest{
		MetadataContext: metadata("ticket-1"),
		Request:         &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: eos}},
	}
}

func responseBody(body string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		MetadataContext: metadata("ticket-1"),
		Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: eos}},
	}
}

func roundTrip(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	t.Helper()
	if err := s.Send(req); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func setHeaders(m *extprocv3.HeaderMutation) map[string]string {
	out := map[string]string{}
	for _, h := range m.GetSetHeaders() {
		out[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	return out
}

// The headers wait for the body; the body's answer carries the rewritten
// list, its exact length and the epoch, and strips the server's own
// x-capsnap-* headers.
func TestRewritesTheDeliveredList(t *testing.T) {
	rec := &recorder{answer: &decide.Delivery{
		Body:    []byte(`{"rewritten":true}`),
		Headers: [][2]string{{decide.HeaderEpoch, "ep_1"}, {decide.HeaderValidUntil, "2027-01-01T00:00:00Z"}},
	}}
	s := stream(t, rec)
	resp := roundTrip(t, s, responseHeaders(false, ":status", "200", "content-type", "text/event-stream", "content-length", "99", "x-capsnap-epoch", "ep_forged"))
	if resp.GetResponseHeaders() == nil || resp.GetResponseHeaders().GetResponse().GetHeaderMutation() != nil {
		t.Fatalf("response headers answered %v, want a plain continue", resp)
	}
	if rec.calls != 0 {
		t.Fatal("decided before the body arrived")
	}
	resp = roundTrip(t, s, responseBody(`{"original":true}`, true))
	common := resp.GetResponseBody().GetResponse()
	if got := string(common.GetBodyMutation().GetBody()); got != `{"rewritten":true}` {
		t.Fatalf("body %q", got)
	}
	h := setHeaders(common.GetHeaderMutation())
	if h["content-length"] != "18" || h[decide.HeaderEpoch] != "ep_1" || h[decide.HeaderValidUntil] == "" {
		t.Fatalf("headers set %v", h)
	}
	if got := common.GetHeaderMutation().GetRemoveHeaders(); len(got) != 1 || got[0] != "x-capsnap-epoch" {
		t.Fatalf("headers removed %v, want the server's x-capsnap-epoch", got)
	}
	want := decide.ResponseHead{Status: 200, ContentType: "text/event-stream", CapsnapHeaders: []string{"x-capsnap-epoch"}}
	if rec.ticket != "ticket-1" || rec.head.Status != want.Status || rec.head.ContentType != want.ContentType || string(rec.body) != `{"original":true}` {
		t.Fatalf("decider saw ticket %q head %+v body %q", rec.ticket, rec.head, rec.body)
	}
}

// A refused response is replaced whole: Envoy sends the JSON-RPC error
// with the decision's status and headers instead.
func TestRefusedResponseIsReplaced(t *testing.T) {
	rec := &decide.Delivery{
		Fail: &deny.Error{Reason: deny.MalformedResponse, Detail: "x"}, Status: 502,
		Body:    []byte(`{"jsonrpc":"2.0","id":1,"error":{"code":-31000}}`),
		Headers: [][2]string{{"content-type", "application/json"}, {decide.HeaderReason, "malformed_response"}},
	}
	s := stream(t, &recorder{answer: rec})
	roundTrip(t, s, responseHeaders(false, ":status", "200", "content-type", "application/json"))
	resp := roundTrip(t, s, responseBody("not json", true))
	ir := resp.GetImmediateResponse()
	if ir == nil || ir.GetStatus().GetCode() != 502 || string(ir.GetBody()) != string(rec.Body) {
		t.Fatalf("answer %v", resp)
	}
	if h := setHeaders(ir.GetHeaders()); h[decide.HeaderReason] != "malformed_response" {
		t.Fatalf("headers %v", h)
	}
}

// A body that comes in parts is a misconfigured processing mode, and the
// decider is told so, to refuse it.
func TestStreamedBodyIsMarked(t *testing.T) {
	rec := &recorder{answer: &decide.Delivery{Fail: &deny.Error{Reason: deny.MalformedResponse}, Status: 502}}
	s := stream(t, rec)
	roundTrip(t, s, responseHeaders(false, ":status", "200", "content-type", "application/json"))
	if resp := roundTrip(t, s, responseBody(`{"jsonrpc"`, false)); resp.GetImmediateResponse() == nil {
		t.Fatalf("answer %v", resp)
	}
	if !rec.head.Streamed {
		t.Fatal("a partial body was not marked streamed")
	}
}

// A response without a body is decided on its headers: nothing delivered
// means nothing pinned, and the answer is the headers'.
func TestBodylessResponse(t *testing.T) {
	rec := &recorder{answer: &decide.Delivery{}}
	s := stream(t, rec)
	resp := roundTrip(t, s, responseHeaders(true, ":status", "404"))
	if resp.GetResponseHeaders() == nil || rec.calls != 1 || rec.head.Status != 404 || rec.body != nil {
		t.Fatalf("answer %v after %d decisions (head %+v)", resp, rec.calls, rec.head)
	}
}

// An empty body is still a body message, and is answered as one: Envoy
// takes an answer of the other kind as a protocol error.
func TestEmptyBodyIsAnsweredAsABody(t *testing.T) {
	rec := &recorder{answer: &decide.Delivery{}}
	s := stream(t, rec)
	roundTrip(t, s, responseHeaders(false, ":status", "200", "content-type", "application/json"))
	if resp := roundTrip(t, s, responseBody("", true)); resp.GetResponseBody() == nil {
		t.Fatalf("answer %v, want a body response", resp)
	}
	if rec.calls != 1 || len(rec.body) != 0 {
		t.Fatalf("%d decisions, body %q", rec.calls, rec.body)
	}
}

// Request-side messages (a filter misconfigured to send them) pass as they
// are: ext_authz decided the request.
func TestRequestSideContinues(t *testing.T) {
	rec := &recorder{}
	s := stream(t, rec)
	resp := roundTrip(t, s, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}})
	if resp.GetRequestHeaders() == nil || rec.calls != 0 {
		t.Fatalf("answer %v", resp)
	}
}

// duplexHeaders is the first message of a stream whose body Envoy streams
// in full duplex: the response headers, and the processing mode.
func duplexHeaders(kv ...string) *extprocv3.ProcessingRequest {
	req := responseHeaders(false, kv...)
	req.ProtocolConfig = &extprocv3.ProtocolConfiguration{ResponseBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	return req
}

// sendAll sends reqs, which Envoy sends in full duplex without waiting.
func sendAll(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient, reqs ...*extprocv3.ProcessingRequest) {
	t.Helper()
	for _, r := range reqs {
		if err := s.Send(r); err != nil {
			t.Fatal(err)
		}
	}
}

func recv(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient) *extprocv3.ProcessingResponse {
	t.Helper()
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// In full duplex the headers' answer waits for the body's last chunk:
// then it sets the epoch and strips the server's x-capsnap-* headers (no
// content-length, which Envoy drops), and the body's answer is the
// rewritten list whole, ending the stream.
func TestDuplexAnswersOnceTheBodyEnds(t *testing.T) {
	rec := &recorder{answer: &decide.Delivery{
		Body:    []byte(`{"rewritten":true}`),
		Headers: [][2]string{{decide.HeaderEpoch, "ep_1"}},
	}}
	s := stream(t, rec)
	sendAll(t, s, duplexHeaders(":status", "200", "content-type", "application/json", "x-capsnap-epoch", "ep_forged"),
		responseBody(`{"original"`, false), responseBody(`:true}`, true))
	resp := recv(t, s)
	hm := resp.GetResponseHeaders().GetResponse().GetHeaderMutation()
	if h := setHeaders(hm); resp.GetResponseHeaders() == nil || h[decide.HeaderEpoch] != "ep_1" || h["content-length"] != "" {
		t.Fatalf("first answer %v, want the headers' with the epoch", resp)
	}
	if got := hm.GetRemoveHeaders(); len(got) != 1 || got[0] != "x-capsnap-epoch" {
		t.Fatalf("headers removed %v, want the server's x-capsnap-epoch", got)
	}
	resp = recv(t, s)
	sr := resp.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if sr == nil || string(sr.GetBody()) != `{"rewritten":true}` || !sr.GetEndOfStream() {
		t.Fatalf("second answer %v, want the whole rewritten body, ending the stream", resp)
	}
	if rec.calls != 1 || string(rec.body) != `{"original":true}` || rec.ticket != "ticket-1" {
		t.Fatalf("%d decisions, body %q, ticket %q", rec.calls, rec.body, rec.ticket)
	}
}

// A body the decision leaves as it is (an error status's JSON-RPC error)
// goes back whole: in full duplex, a body not answered is lost.
func TestDuplexReturnsAnUnchangedBody(t *testing.T) {
	s := stream(t, &recorder{answer: &decide.Delivery{}})
	sendAll(t, s, duplexHeaders(":status", "404", "content-type", "application/json"),
		responseBody(`{"jsonrpc":"2.0",`, false), responseBody(`"id":1,"error":{}}`, true))
	if resp := recv(t, s); resp.GetResponseHeaders() == nil {
		t.Fatalf("first answer %v", resp)
	}
	sr := recv(t, s).GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if string(sr.GetBody()) != `{"jsonrpc":"2.0","id":1,"error":{}}` || !sr.GetEndOfStream() {
		t.Fatalf("body answered %v", sr)
	}
}

// A refusal replaces the response: one immediate answer, no headers' or
// body's.
func TestDuplexRefusalIsReplaced(t *testing.T) {
	fail := &decide.Delivery{Fail: &deny.Error{Reason: deny.MalformedResponse}, Status: 502, Body: []byte(`{"error":{}}`)}
	s := stream(t, &recorder{answer: fail})
	sendAll(t, s, duplexHeaders(":status", "200", "content-type", "application/json"), responseBody("not json", true))
	if ir := recv(t, s).GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() != 502 || string(ir.GetBody()) != `{"error":{}}` {
		t.Fatalf("answer %v", ir)
	}
}

// A body past MaxResponseBytes is read no further: the decider gets what
// came, over the bound, to refuse, before the body ends, and the stream
// ends with the refusal.
func TestDuplexBodyOverTheBound(t *testing.T) {
	rec := &recorder{max: 10, answer: &decide.Delivery{Fail: &deny.Error{Reason: deny.MalformedResponse}, Status: 502}}
	s := stream(t, rec)
	sendAll(t, s, duplexHeaders(":status", "200", "content-type", "application/json"),
		responseBody("123456", false), responseBody("789012", false))
	if ir := recv(t, s).GetImmediateResponse(); ir == nil {
		t.Fatal("no refusal")
	}
	if rec.calls != 1 || string(rec.body) != "123456789012" {
		t.Fatalf("%d decisions on %q", rec.calls, rec.body)
	}
	if _, err := s.Recv(); err != io.EOF {
		t.Fatalf("the stream went on after the refusal: %v", err)
	}
}

// Trailers end the body: the answers come then, the body's not ending the
// stream, and the trailers are answered after.
func TestDuplexBodyEndedByTrailers(t *testing.T) {
	rec := &recorder{answer: &decide.Delivery{Body: []byte("new")}}
	s := stream(t, rec)
	sendAll(t, s, duplexHeaders(":status", "200", "content-type", "application/json"), responseBody("old", false),
		&extprocv3.ProcessingRequest{MetadataContext: metadata("ticket-1"), Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
	if resp := recv(t, s); resp.GetResponseHeaders() == nil {
		t.Fatalf("first answer %v", resp)
	}
	sr := recv(t, s).GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if string(sr.GetBody()) != "new" || sr.GetEndOfStream() {
		t.Fatalf("body answered %v, want the new body, the trailers still to come", sr)
	}
	if resp := recv(t, s); resp.GetResponseTrailers() == nil {
		t.Fatalf("third answer %v, want the trailers'", resp)
	}
	if rec.calls != 1 || string(rec.body) != "old" {
		t.Fatalf("%d decisions on %q", rec.calls, rec.body)
	}
}

// A body over 64 KiB goes back in chunks of at most that, only the last
// ending the stream, and together they are the body.
func TestDuplexLargeBodyInChunks(t *testing.T) {
	big := strings.Repeat("x", 2*maxChunk+5)
	s := stream(t, &recorder{answer: &decide.Delivery{Body: []byte(big)}})
	sendAll(t, s, duplexHeaders(":status", "200", "content-type", "application/json"), responseBody("{}", true))
	if resp := recv(t, s); resp.GetResponseHeaders() == nil {
		t.Fatalf("first answer %v", resp)
	}
	var got strings.Builder
	for i, want := range []int{maxChunk, maxChunk, 5} {
		sr := recv(t, s).GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if len(sr.GetBody()) != want || sr.GetEndOfStream() != (i == 2) {
			t.Fatalf("chunk %d: %d bytes, end %v", i, len(sr.GetBody()), sr.GetEndOfStream())
		}
		got.Write(sr.GetBody())
	}
	if got.String() != big {
		t.Fatal("the chunks are not the body")
	}
}

// A refusal of a body that trailers ended answers the whole stream: no
// answer to the trailers follows it.
func TestDuplexRefusalWithTrailers(t *testing.T) {
	rec := &recorder{answer: &decide.Delivery{Fail: &deny.Error{Reason: deny.MalformedResponse}, Status: 502}}
	s := stream(t, rec)
	sendAll(t, s, duplexHeaders(":status", "200", "content-type", "application/json"), responseBody("not json", false),
		&extprocv3.ProcessingRequest{MetadataContext: metadata("ticket-1"), Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
	if ir := recv(t, s).GetImmediateResponse(); ir == nil {
		t.Fatal("no refusal")
	}
	if resp, err := s.Recv(); err != io.EOF {
		t.Fatalf("after the refusal: %v, %v; want the stream's end", resp, err)
	}
}

// Past the bound, a decider that does not refuse still delivers nothing:
// the stream fails, and Envoy answers status_on_error (failure_mode_allow
// is false), never part of the response as if it were whole.
func TestDuplexOverTheBoundFailsClosed(t *testing.T) {
	s := stream(t, &recorder{max: 4, answer: &decide.Delivery{}})
	sendAll(t, s, duplexHeaders(":status", "200", "content-type", "application/json"), responseBody("12345", false))
	if resp, err := s.Recv(); err == nil || err == io.EOF {
		t.Fatalf("answered %v, %v; want the stream to fail", resp, err)
	}
}

// A body exactly at the bound is read whole and decided at its end.
func TestDuplexBodyAtTheBound(t *testing.T) {
	rec := &recorder{max: 6, answer: &decide.Delivery{}}
	s := stream(t, rec)
	sendAll(t, s, duplexHeaders(":status", "200", "content-type", "application/json"), responseBody("123", false), responseBody("456", true))
	if resp := recv(t, s); resp.GetResponseHeaders() == nil {
		t.Fatalf("first answer %v", resp)
	}
	if sr := recv(t, s).GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse(); string(sr.GetBody()) != "123456" {
		t.Fatalf("body answered %v", sr)
	}
	if rec.calls != 1 || string(rec.body) != "123456" {
		t.Fatalf("%d decisions on %q", rec.calls, rec.body)
	}
}

// In full duplex a response without a body is decided on its headers, as
// in the buffered mode.
func TestDuplexBodylessResponse(t *testing.T) {
	rec := &recorder{answer: &decide.Delivery{}}
	s := stream(t, rec)
	req := duplexHeaders(":status", "404")
	req.GetResponseHeaders().EndOfStream = true
	if resp := roundTrip(t, s, req); resp.GetResponseHeaders() == nil || rec.calls != 1 || rec.body != nil {
		t.Fatalf("answer %v after %d decisions", resp, rec.calls)
	}
}

// Envoy saying it buffers is the buffered mode: the headers are answered
// at once, and the whole body in one message.
func TestBufferedProtocolConfig(t *testing.T) {
	rec := &recorder{answer: &decide.Delivery{Body: []byte("new")}}
	s := stream(t, rec)
	req := responseHeaders(false, ":status", "200", "content-type", "application/json")
	req.ProtocolConfig = &extprocv3.ProtocolConfiguration{ResponseBodyMode: extprocfilterv3.ProcessingMode_BUFFERED}
	if resp := roundTrip(t, s, req); resp.GetResponseHeaders() == nil || rec.calls != 0 {
		t.Fatalf("headers answered %v after %d decisions, want a plain continue", resp, rec.calls)
	}
	if got := roundTrip(t, s, responseBody("old", true)).GetResponseBody().GetResponse().GetBodyMutation().GetBody(); string(got) != "new" {
		t.Fatalf("body %q", got)
	}
}

// A tools/list's own answer that ends before its body reached Deliver is
// reported to Aborted, under the ticket of its headers' metadata or, when
// Envoy ended the stream before it sent anything, the ticket it opened
// the stream with; a delivered one, or a stream opened with no ticket
// ("-", Envoy's formatter's word for none), is not.
func TestAborted(t *testing.T) {
	for _, tt := range []struct {
		name, opened string
		send         []*extprocv3.ProcessingRequest
		want         []string
	}{
		{name: "no message", opened: "ticket-0", want: []string{"ticket-0"}},
		{name: "headers and part of the body", opened: "ticket-0", send: []*extprocv3.ProcessingRequest{
			duplexHeaders(":status", "200", "content-type", "application/json"),
			responseBody(`{"jsonrpc":`, false),
		}, want: []string{"ticket-1"}},
		{name: "headers, no ticket opened", send: []*extprocv3.ProcessingRequest{
			duplexHeaders(":status", "200", "content-type", "application/json"),
		}, want: []string{"ticket-1"}},
		{name: "none opened", opened: "-"},
		{name: "not a listing's", send: []*extprocv3.ProcessingRequest{screenedHeaders(true, false, ":status", "200", "content-type", "application/json")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{answer: &decide.Delivery{}}
			s, cancel := streamWith(t, rec, tt.opened)
			sendAll(t, s, tt.send...)
			if err := s.CloseSend(); err != nil {
				t.Fatal(err)
			}
			_, _ = s.Recv()
			cancel()
			deadline := time.Now().Add(5 * time.Second)
			for {
				rec.mu.Lock()
				got := slices.Clone(rec.aborted)
				rec.mu.Unlock()
				if slices.Equal(got, tt.want) || time.Now().After(deadline) {
					if !slices.Equal(got, tt.want) {
						t.Fatalf("aborted %q, want %q", got, tt.want)
					}
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			if rec.calls != 0 {
				t.Fatalf("%d deliveries", rec.calls)
			}
		})
	}
}
