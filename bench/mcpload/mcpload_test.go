package mcpload

import (
	"testing"
	"time"
)

func TestReplyError(t *testing.T) {
	for _, c := range []struct {
		name, contentType, body string
		want, reason            string
	}{
		{"sse handler drift", "text/event-stream", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-31002,\"message\":\"refused at handler start\",\"data\":{\"reason\":\"handler_drift\"}}}\n\n", "JSON-RPC error: refused at handler start", "handler_drift"},
		{"data not an object", "application/json", `{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m","data":"text"}}`, "JSON-RPC error: m", ""},
		{"sse result", "text/event-stream", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"Refund rf_0001 issued\"}]}}\n\n", "", ""},
		{"sse tool error", "text/event-stream", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"isError\":true,\"content\":[{\"type\":\"text\",\"text\":\"handler_drift\"}]}}\n\n", "tool error: handler_drift", ""},
		{"json error", "application/json", `{"jsonrpc":"2.0","id":1,"error":{"code":-31001,"message":"capability_drift schema_drift"}}`, "JSON-RPC error: capability_drift schema_drift", ""},
		{"json result", "application/json", `{"jsonrpc":"2.0","id":1,"result":{}}`, "", ""},
		{"accepted notification", "", "", "", ""},
		{"garbage", "application/json", "<html>", "unreadable answer: invalid character '<' looking for beginning of value", ""},
	} {
		got, reason := replyError(c.contentType, []byte(c.body))
		if got != c.want || reason != c.reason {
			t.Errorf("%s: got %q (%q), want %q (%q)", c.name, got, reason, c.want, c.reason)
		}
	}
}

func TestReplyOK(t *testing.T) {
	if !(Reply{Status: 200}).OK() || !(Reply{Status: 202}).OK() {
		t.Fatal("2xx without error is OK")
	}
	if (Reply{Status: 403}).OK() || (Reply{Status: 200, Error: "x"}).OK() {
		t.Fatal("a refusal is not OK")
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i))
	}
	if Percentile(d, 50) != 50 || Percentile(d, 99) != 99 || Percentile(d, 100) != 100 {
		t.Fatalf("p50 %v p99 %v p100 %v", Percentile(d, 50), Percentile(d, 99), Percentile(d, 100))
	}
	if Percentile(d[:1], 99) != 1 || Percentile(nil, 50) != 0 {
		t.Fatal("edge cases")
	}
}

func TestSummarize(t *testing.T) {
	a := Sample{Latencies: []time.Duration{3, 1, 2}, Elapsed: time.Second}
	b := Sample{Latencies: []time.Duration{4}, Elapsed: time.Second}
	r := Summarize(a, b)
	if r.Calls != 4 || r.RPS != 2 || r.P50 != 2 || r.P90 != 4 || r.Max != 4 || r.Mean != 2 || r.Elapsed != 2*time.Second {
		t.Fatalf("got %+v", r)
	}
	if z := Summarize(); z.Calls != 0 || z.RPS != 0 {
		t.Fatalf("empty: %+v", z)
	}
}
