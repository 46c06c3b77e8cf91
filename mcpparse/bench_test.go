package mcpparse

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkParse measures Parse on the bodies the Go SDK client sends for a
// tools/call, as Envoy hands them over.
func BenchmarkParse(b *testing.B) {
	call1125 := `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"refund","arguments":{"amount":40,"order_id":"A-100","reason_code":"duplicate_charge"}}}`
	call2026 := `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/clientCapabilities":{"roots":{"listChanged":true}},"io.modelcontextprotocol/clientInfo":{"name":"support-agent","version":"1.0.0"},"io.modelcontextprotocol/protocolVersion":"2026-07-28"},"name":"refund","arguments":{"amount":40,"order_id":"A-100","reason_code":"duplicate_charge"}}}`
	batch := `[{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t1","progress":50}},` + call1125 + `,{"jsonrpc":"2.0","id":12,"result":{"roots":[]}}]`
	tests := []struct {
		name, body string
		headers    map[string]string
	}{
		{"2025-11-25 tools/call", call1125, withJSON("mcp-protocol-version", "2025-11-25", "mcp-session-id", "5ZNBIBSFL7MVYJQ5OQSJOAEGJD", "content-length", strconv.Itoa(len(call1125)))},
		{"2026-07-28 tools/call", call2026, withJSON("mcp-protocol-version", "2026-07-28", "mcp-method", "tools/call", "mcp-name", "refund", "content-length", strconv.Itoa(len(call2026)))},
		{"2025-03-26 batch", batch, withJSON("mcp-session-id", "5ZNBIBSFL7MVYJQ5OQSJOAEGJD")},
	}
	for _, tt := range tests {
		b.Run(tt.name, func(b *testing.B) {
			body := []byte(tt.body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(body, tt.headers, Limits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkToolDigest(b *testing.B) {
	def := []byte(`{"name":"refund","description":"Refund part or all of an order's charge, in USD.","inputSchema":{"type":"object","properties":{"order_id":{"type":"string"},"amount":{"type":"number","exclusiveMinimum":0,"maximum":250},"reason_code":{"type":"string","enum":["duplicate_charge","damaged","not_received"]}},"required":["order_id","amount","reason_code"]},"annotations":{"destructiveHint":true}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ToolDigest(def); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkToolsDigests digests a whole tools/list result of 225 tools, as
// the catalog does on every refresh and list_changed.
func BenchmarkToolsDigests(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"tools":[`)
	for i := range 225 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"name":"tool_%03d","description":"Tool number %d.","inputSchema":{"type":"object","properties":{"id":{"type":"string"},"amount":{"type":"number","maximum":250}},"required":["id"]},"annotations":{"readOnlyHint":true}}`, i, i)
	}
	sb.WriteString(`]}`)
	list := []byte(sb.String())
	b.SetBytes(int64(len(list)))
	b.ReportAllocs()
	for b.Loop() {
		got, err := ToolsDigests(list)
		if err != nil || len(got) != 225 {
			b.Fatalf("%d digests, %v", len(got), err)
		}
	}
}
