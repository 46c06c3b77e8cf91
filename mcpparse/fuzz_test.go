package mcpparse

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/capsnap/capsnap/deny"
)

// FuzzCheckJSON holds the checker to two well-kept parsers: with case
// folding off, it must accept exactly the documents that encoding/json
// finds valid and jcs.Transform (which rejects duplicates, invalid UTF-8,
// bad surrogates and out-of-range numbers) canonicalizes.
func FuzzCheckJSON(f *testing.F) {
	for _, s := range []string{`{}`, `[1,"a",{"b":null}]`, `{"a":1,"a":2}`, `"\ud800"`, `1e400`, `-0.0e-0`, " \t\n\r1 ", "\"\xff\"", `{"a":{"b":[true,false]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := checkJSON(data, maxNestingOfJCS, false)
		_, jcsErr := jcs.Transform(data)
		oracle := json.Valid(data) && jcsErr == nil
		if (err == nil) != oracle {
			t.Fatalf("checkJSON(%q) = %v, but encoding/json valid=%v and jcs.Transform err=%v", data, err, json.Valid(data), jcsErr)
		}
	})
}

// maxNestingOfJCS is jcs.Transform's own nesting limit.
const maxNestingOfJCS = 10000

// fuzzVersions are what FuzzParse's version byte selects for the
// MCP-Protocol-Version header: none, or one of the versions capsnap speaks
// (unknown ones are covered by the table tests; random strings would only
// keep the fuzzer from ever reaching the body).
var fuzzVersions = []Version{"", V20250326, V20250618, V20251125, V20260728}

// Bits of FuzzParse's mirror byte: which mirror headers to derive from the
// body, as a client would, so that the fuzzer explores agreeing headers as
// well as disagreeing ones.
const (
	mirrorMethod = 1 << iota
	mirrorName
	mirrorBase64
)

// FuzzParse: Parse never panics, refuses only with *deny.Error, and
// whatever it accepts reads the same to encoding/json (which matches names
// case-insensitively), to the Go SDK's own JSON-RPC decoder, and to Parse
// again after re-serialization.
func FuzzParse(f *testing.F) {
	f.Add([]byte(refund(refundArgs)), uint8(0), uint8(0))
	f.Add([]byte(call2026(`"refund"`)), uint8(4), uint8(mirrorMethod|mirrorName))
	f.Add([]byte(call2026(`"tööl"`)), uint8(4), uint8(mirrorMethod|mirrorName|mirrorBase64))
	f.Add([]byte(`[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":"2","result":{}}]`), uint8(1), uint8(0))
	f.Add([]byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}`), uint8(0), uint8(0))
	f.Add([]byte(`{"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"no"}}`), uint8(3), uint8(0))
	f.Fuzz(func(t *testing.T, body []byte, version, mirror uint8) {
		h := withJSON()
		if v := fuzzVersions[int(version)%len(fuzzVersions)]; v != "" {
			h["mcp-protocol-version"] = string(v)
		}
		var lenient struct {
			Method string `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		if json.Unmarshal(body, &lenient) == nil {
			if mirror&mirrorMethod != 0 {
				h["mcp-method"] = lenient.Method
			}
			if mirror&mirrorName != 0 {
				h["mcp-name"] = lenient.Params.Name
				if mirror&mirrorBase64 != 0 {
					h["mcp-name"] = base64Prefix + base64.StdEncoding.EncodeToString([]byte(lenient.Params.Name)) + base64Suffix
				}
			}
		}
		r, err := Parse(body, h, Limits{})
		if err != nil {
			if _, ok := err.(*deny.Error); !ok {
				t.Fatalf("error %v is a %T", err, err)
			}
			return
		}
		if len(r.Messages) == 0 || (!r.Batch && len(r.Messages) != 1) {
			t.Fatalf("accepted with %d messages (batch %v)", len(r.Messages), r.Batch)
		}
		if _, err := jcs.Transform(body); err != nil {
			t.Fatalf("accepted %q, which jcs.Transform rejects: %v", body, err)
		}
		var elements []json.RawMessage
		if r.Batch {
			if err := json.Unmarshal(body, &elements); err != nil {
				t.Fatal(err)
			}
		} else {
			elements = []json.RawMessage{body}
		}
		for i, el := range elements {
			checkAgainstDecoders(t, el, r.Messages[i])
		}

		var compact bytes.Buffer
		if err := json.Compact(&compact, body); err != nil {
			t.Fatal(err)
		}
		again, err := Parse(compact.Bytes(), h, Limits{})
		if err != nil {
			t.Fatalf("accepted %q but not its compact form: %v", body, err)
		}
		if len(again.Messages) != len(r.Messages) || again.Version != r.Version {
			t.Fatalf("compact form parses differently")
		}
		for i := range again.Messages {
			a, b := again.Messages[i], r.Messages[i]
			if a.Kind != b.Kind || a.Method != b.Method || a.Tool != b.Tool || !bytes.Equal(a.ID, b.ID) {
				t.Fatalf("message %d: compact form reads %+v, original %+v", i, a, b)
			}
		}
	})
}

// checkAgainstDecoders decodes one accepted message as a lenient Go server
// would and as the Go SDK does, and fails unless both agree with m.
func checkAgainstDecoders(t *testing.T, el json.RawMessage, m Message) {
	t.Helper()
	var lenient struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      any             `json:"id"`
		Method  string          `json:"method"`
		Params  json.RawMessage `json:"params"`
	}
	if err := json.Unmarshal(el, &lenient); err != nil {
		t.Fatalf("encoding/json cannot decode accepted %q: %v", el, err)
	}
	if lenient.JSONRPC != "2.0" || lenient.Method != m.Method {
		t.Fatalf("encoding/json reads %q as method %q, Parse as %q", el, lenient.Method, m.Method)
	}
	if m.Method == "tools/call" {
		var p struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := json.Unmarshal(lenient.Params, &p); err != nil {
			t.Fatal(err)
		}
		if p.Name != m.Tool || !bytes.Equal(p.Arguments, m.Arguments) {
			t.Fatalf("encoding/json reads tool %q args %s, Parse %q %s", p.Name, p.Arguments, m.Tool, m.Arguments)
		}
	}

	sdk, err := jsonrpc.DecodeMessage(el)
	if err != nil {
		t.Fatalf("the Go SDK cannot decode accepted %q: %v", el, err)
	}
	var sdkID jsonrpc.ID
	switch sm := sdk.(type) {
	case *jsonrpc.Request:
		if sm.Method != m.Method || sm.IsCall() != (m.Kind == KindRequest) || m.Kind == KindResponse {
			t.Fatalf("the Go SDK reads %q as %q call=%v, Parse as %q %s", el, sm.Method, sm.IsCall(), m.Method, m.Kind)
		}
		sdkID = sm.ID
	case *jsonrpc.Response:
		if m.Kind != KindResponse {
			t.Fatalf("the Go SDK reads %q as a response, Parse as a %s", el, m.Kind)
		}
		sdkID = sm.ID
	}
	if m.ID != nil {
		var raw any
		if err := json.Unmarshal(m.ID, &raw); err != nil {
			t.Fatal(err)
		}
		want, err := jsonrpc.MakeID(raw)
		if err != nil || want != sdkID {
			t.Fatalf("the Go SDK reads id %v, Parse %s", sdkID, m.ID)
		}
	}
}

// FuzzToolDigest: a digest survives re-serialization of the definition, by
// encoding/json and of the canonical form itself.
func FuzzToolDigest(f *testing.F) {
	f.Add([]byte(`{"name":"refund","description":"Refund.","inputSchema":{"type":"object","properties":{"amount":{"type":"number","maximum":2.5e2}}}}`))
	f.Add([]byte(`{"inputSchema":{"type":"object"},"name":"a\u00e9\ud83d\ude00","_meta":{"x":1}}`))
	f.Add([]byte(`{"name":"n","annotations":{"readOnlyHint":true},"outputSchema":{"type":"object","examples":[1e21,-0,0.1]}}`))
	f.Fuzz(func(t *testing.T, def []byte) {
		digest, canonical, err := ToolDigest(def)
		if err != nil {
			return
		}
		if !strings.HasPrefix(digest, DigestPrefix) || len(digest) != len(DigestPrefix)+64 {
			t.Fatalf("digest %q", digest)
		}
		d2, c2, err := ToolDigest(canonical)
		if err != nil || d2 != digest || !bytes.Equal(c2, canonical) {
			t.Fatalf("canonical form %s digests to %s (%v), want %s", canonical, d2, err, digest)
		}
		var v any
		if err := json.Unmarshal(def, &v); err != nil {
			t.Fatalf("encoding/json cannot read accepted %q: %v", def, err)
		}
		reserialized, err := json.MarshalIndent(v, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		d3, _, err := ToolDigest(reserialized)
		if err != nil || d3 != digest {
			t.Fatalf("re-serialized %s digests to %s (%v), want %s", reserialized, d3, err, digest)
		}
	})
}
