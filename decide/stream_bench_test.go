package decide

import (
	"bytes"
	"testing"
)

// BenchmarkScreen is the response path of an answer that is not a
// tools/list's own, which every tools/call answer now takes: a result in
// one event, and one ten times its size, whose text names tools (so the
// event is read strictly, not only scanned).
func BenchmarkScreen(b *testing.B) {
	f := newFixture(b, discardAudit)
	head := ResponseHead{Status: 200, ContentType: "text/event-stream"}
	small := []byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"Order A-100: delivered, USD 120.00.\"}]}}\n\n")
	large := []byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"content\":[" +
		string(bytes.Repeat([]byte(`{"type":"text","text":"the tools you may call: lookup_order, refund"},`), 40)) +
		`{"type":"text","text":"end"}]}}` + "\n\n")
	for _, c := range []struct {
		name string
		body []byte
	}{{"call_result", small}, {"call_result_naming_tools_2KiB", large}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			for b.Loop() {
				if out := f.Screen("billing", head, c.body).Content; len(out) != len(c.body) {
					b.Fatalf("screened %q", out)
				}
			}
		})
	}
}
