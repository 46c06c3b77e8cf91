package mcpparse

import (
	"encoding/json"
	"testing"
)

func TestFailed(t *testing.T) {
	id := json.RawMessage(`7`)
	for _, tt := range []struct {
		name             string
		content          string
		sse              bool
		answered, failed bool
	}{
		{"a result", `{"jsonrpc":"2.0","id":7,"result":{"content":[]}}`, false, true, false},
		{"a tool error", `{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":true}}`, false, true, true},
		{"isError false", `{"jsonrpc":"2.0","id":7,"result":{"isError":false}}`, false, true, false},
		{"a JSON-RPC error", `{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"boom"}}`, false, true, true},
		{"another id's error", `{"jsonrpc":"2.0","id":8,"error":{"code":1,"message":"x"}}`, false, false, false},
		{"a string id is another", `{"jsonrpc":"2.0","id":"7","error":{"code":1,"message":"x"}}`, false, false, false},
		{"isError in another case", `{"jsonrpc":"2.0","id":7,"result":{"IsError":true}}`, false, true, false},
		{"isError a string", `{"jsonrpc":"2.0","id":7,"result":{"isError":"true"}}`, false, true, false},
		{"a duplicate member", `{"jsonrpc":"2.0","id":7,"result":{"isError":true},"result":{}}`, false, false, false},
		{"in a batch", `[{"jsonrpc":"2.0","id":3,"result":{}},{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"x"}}]`, false, true, true},
		{"not JSON", `Internal Server Error`, false, false, false},
		{"the last event", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"isError\":true}}\n\n", true, true, true},
		{"progress only", "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n", true, false, false},
		{"a broken stream", "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{}}\r\r\n", true, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			answered, failed := Failed([]byte(tt.content), tt.sse, id, 64)
			if answered != tt.answered || failed != tt.failed {
				t.Errorf("Failed = %v, %v; want %v, %v", answered, failed, tt.answered, tt.failed)
			}
		})
	}
}

// Failed never panics, and says failed only of an answer it found.
func FuzzFailed(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":7,"result":{"isError":true}}`), false)
	f.Add([]byte("data: {\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":1}}\n\n"), true)
	f.Fuzz(func(t *testing.T, content []byte, sse bool) {
		if answered, failed := Failed(content, sse, json.RawMessage(`7`), 64); failed && !answered {
			t.Fatalf("failed without an answer: %q", content)
		}
	})
}
