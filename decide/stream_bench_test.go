package decide

import (
	"bytes"
	"testing"
)

// BenchmarkScreen is the response path of an answer that is not a
// tools/list's own, which every tools/call answer now takes: a result in
// one event, one ten times its size whose text names tools (so the event
// is read strictly, not only scanned), and a small JSON body; each
// counted as the adapter counts it.
func BenchmarkScreen(b *testing.B) {
	f := newFixture(b, discardAudit)
	head := ResponseHead{Status: 200, ContentType: "text/event-stream"}
	small := []byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"Order A-100: delivered, USD 120.00.\"}]}}\n\n")
	large := []byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"content\":[" +
		string(bytes.Repeat([]byte(`{"type":"text","text":"the tools you may call: lookup_order, refund"},`), 40)) +
		`{"type":"text","text":"end"}]}}` + "\n\n")
	jsonHead := ResponseHead{Status: 200, ContentType: "application/json"}
	smallJSON := []byte(`{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"Order A-100: delivered, USD 120.00."}]}}`)
	for _, c := range []struct {
		name string
		head ResponseHead
		body []byte
	}{{"call_result", head, small}, {"call_result_naming_tools_2KiB", head, large}, {"call_result_json", jsonHead, smallJSON}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			for b.Loop() {
				// As the adapter screens an answer: its content, and the
				// count of the answer that passed.
				if out := f.Screen("billing", c.head, c.body).Content; len(out) != len(c.body) {
					b.Fatalf("screened %q", out)
				}
				f.Passed("billing", true)
			}
		})
	}
}
