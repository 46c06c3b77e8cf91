package mcpload

import (
	"context"
	"errors"
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

func TestWorkers(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		name    string
		perCall int // calls each worker may make, 0 for no bound
		failAt  int // the worker's call that fails, 0 for none
		d       time.Duration
		calls   int
		err     string
	}{
		{name: "bounded by count", perCall: 5, d: time.Minute, calls: 15},
		{name: "bounded by time", d: 30 * ms},
		{name: "a call fails", perCall: 5, failAt: 3, d: time.Minute, calls: 6, err: "refused"},
	} {
		t.Run(c.name, func(t *testing.T) {
			made := make([]int, 3)
			more := func(w int) bool { return c.perCall == 0 || made[w] < c.perCall }
			s, err := Workers(context.Background(), 3, c.d, more, func(w int) (time.Duration, error) {
				made[w]++
				if made[w] == c.failAt {
					return 0, errors.New("refused")
				}
				time.Sleep(ms)
				return time.Duration(w+1) * ms, nil
			})
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("err %v, want %q", err, c.err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if c.calls != 0 && len(s.Latencies) != c.calls {
				t.Fatalf("%d latencies, want %d", len(s.Latencies), c.calls)
			}
			// Each call's latency is the one it measured.
			for _, l := range s.Latencies {
				if l != ms && l != 2*ms && l != 3*ms {
					t.Fatalf("latency %v", l)
				}
			}
			if c.perCall == 0 && (s.Elapsed < c.d || len(s.Latencies) == 0) {
				t.Fatalf("elapsed %v with %d calls, want at least %v", s.Elapsed, len(s.Latencies), c.d)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Workers(ctx, 2, time.Minute, func(int) bool { return true }, func(int) (time.Duration, error) { return ms, nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled run: %v", err)
	}
}
