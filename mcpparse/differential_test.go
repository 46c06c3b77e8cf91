package mcpparse

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	segjson "github.com/segmentio/encoding/json"
)

// sdkCall is what the official Go SDK server reads from one JSON-RPC
// message: jsonrpc.DecodeMessage, then the params bound to
// mcp.CallToolParamsRaw by the decoder the SDK's internal/json uses
// (segmentio/encoding/json, case-sensitive struct fields).
type sdkCall struct {
	Method    string
	IsCall    bool
	Tool      string
	Arguments []byte // compacted; nil when absent
}

// sdkRead decodes el as the Go SDK server does. ok is false when the SDK
// refuses the message (then it runs nothing).
func sdkRead(el []byte) (c sdkCall, ok bool, err error) {
	msg, err := jsonrpc.DecodeMessage(el)
	if err != nil {
		return c, false, err
	}
	req, isReq := msg.(*jsonrpc.Request)
	if !isReq {
		return c, true, nil
	}
	c.Method, c.IsCall = req.Method, req.IsCall()
	if req.Method != "tools/call" {
		return c, true, nil
	}
	var p mcp.CallToolParamsRaw
	dec := segjson.NewDecoder(bytes.NewReader(req.Params))
	dec.DontMatchCaseInsensitiveStructFields()
	if err := dec.Decode(&p); err != nil {
		return c, false, err
	}
	c.Tool = p.Name
	if p.Arguments != nil {
		c.Arguments = compactJSON(p.Arguments)
	}
	return c, true, nil
}

func compactJSON(b []byte) []byte {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return append([]byte("INVALID:"), b...)
	}
	return out.Bytes()
}

// differential holds one body that Parse accepted to the Go SDK's reading
// of it: per message, the same method, the same call-or-not, and for a
// tools/call the same tool name and the same arguments (compacted). It
// returns a description of the first difference, or "".
func differential(body []byte, r *Request) string {
	var elements []json.RawMessage
	if r.Batch {
		if err := json.Unmarshal(body, &elements); err != nil {
			return "encoding/json cannot split the accepted batch: " + err.Error()
		}
	} else {
		elements = []json.RawMessage{body}
	}
	if len(elements) != len(r.Messages) {
		return "message count differs"
	}
	for i, el := range elements {
		m := r.Messages[i]
		got, ok, err := sdkRead(el)
		if !ok {
			// The SDK refuses what Parse accepted: a differential in
			// the safe direction (nothing runs), but still a difference
			// for a call.
			if m.Method == "tools/call" {
				return "the Go SDK refuses a tools/call capsnap accepted: " + err.Error()
			}
			continue
		}
		if m.Kind == KindResponse {
			if got.Method != "" {
				return "the Go SDK reads a request where Parse read a response"
			}
			continue
		}
		if got.Method != m.Method || got.IsCall != (m.Kind == KindRequest) {
			return "method/kind: SDK " + got.Method + ", Parse " + m.Method + " " + m.Kind.String()
		}
		if m.Method != "tools/call" {
			continue
		}
		var want []byte
		if m.Arguments != nil {
			want = compactJSON(m.Arguments)
		}
		if got.Tool != m.Tool {
			return "tool: SDK " + got.Tool + ", Parse " + m.Tool
		}
		if !bytes.Equal(got.Arguments, want) {
			return "arguments: SDK " + string(got.Arguments) + ", Parse " + string(want)
		}
	}
	return ""
}

// TestDifferentialHostileCorpus: for every body of the hostile corpus
// (../decide/testdata/hostile) and every request golden
// (testdata/requests), whatever Parse accepts, the Go SDK server reads as
// the same method, tool and arguments.
func TestDifferentialHostileCorpus(t *testing.T) {
	type body struct {
		name    string
		headers map[string]string
		bytes   []byte
	}
	var bodies []body
	files, err := filepath.Glob("../decide/testdata/hostile/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no hostile corpus: %v", err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var c struct {
			Name    string            `json:"name"`
			Headers map[string]string `json:"headers"`
			Body    string            `json:"body"`
			BodyB64 string            `json:"body_b64"`
		}
		if err := json.Unmarshal(data, &c); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		b := []byte(c.Body)
		if c.BodyB64 != "" {
			if b, err = base64.StdEncoding.DecodeString(c.BodyB64); err != nil {
				t.Fatal(err)
			}
		}
		h := withJSON()
		for k, v := range c.Headers {
			h[k] = v
		}
		bodies = append(bodies, body{"hostile/" + c.Name, h, b})
	}
	goldens, err := filepath.Glob("testdata/requests/*.json")
	if err != nil || len(goldens) == 0 {
		t.Fatalf("no request goldens: %v", err)
	}
	for _, file := range goldens {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var cases []requestCase
		if err := json.Unmarshal(data, &cases); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, c := range cases {
			bodies = append(bodies, body{filepath.Base(file) + "/" + c.Name, c.Headers, c.body(t)})
		}
	}
	var accepted, calls int
	for _, b := range bodies {
		t.Run(b.name, func(t *testing.T) {
			r, err := Parse(b.bytes, b.headers, Limits{})
			if err != nil {
				return // denied: nothing reaches a server
			}
			accepted++
			for _, m := range r.Messages {
				if m.Method == "tools/call" {
					calls++
				}
			}
			if diff := differential(b.bytes, r); diff != "" {
				t.Fatalf("parser differential on %.200q: %s", b.bytes, diff)
			}
		})
	}
	t.Logf("%d bodies, %d accepted by Parse (%d tools/call), all read the same by the Go SDK", len(bodies), accepted, calls)
}
