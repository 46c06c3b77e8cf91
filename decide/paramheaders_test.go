package decide

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/deny"
)

// A tools/call's Mcp-Param-* headers are held to its arguments under the
// pinned definition's x-mcp-header annotations (lookup_order's order_id
// mirrors Mcp-Param-Order in catalog-param-header.json), and a
// disagreement is answered as a disagreeing Mcp-Method is: -32020, HTTP
// 400, the request's id.
func TestParamHeaders(t *testing.T) {
	f := newFixture(t)
	f.billing.push(t, "testdata/catalog-param-header.json", nil)
	lookup := func(ver string, args map[string]any, kv ...string) checkCase {
		c := mcpRequest(t, ver, "tools/call", map[string]any{"name": "lookup_order", "arguments": args})
		for i := 0; i < len(kv); i += 2 {
			c.Headers[kv[i]] = kv[i+1]
		}
		return c
	}
	order := map[string]any{"order_id": "A-1"}
	tests := []struct {
		name   string
		c      checkCase
		detail string // "" when allowed
	}{
		{"2026 header agrees", lookup("2026-07-28", order, "mcp-param-order", "A-1"), ""},
		{"2026 header base64-encoded", lookup("2026-07-28", order, "mcp-param-order", "=?base64?QS0x?="), ""},
		{"2026 no annotated argument, no header", lookup("2026-07-28", map[string]any{"note": "n"}), "invalid_arguments"},
		{"2025-11-25 without the header", lookup("2025-11-25", order), ""},
		{"2025-11-25 header agrees", lookup("2025-11-25", order, "mcp-param-order", "A-1"), ""},

		{"2026 value disagrees", lookup("2026-07-28", order, "mcp-param-order", "B-2"), `header "mcp-param-order": "B-2" disagrees with the argument "order_id"`},
		{"2026 missing header", lookup("2026-07-28", order), `protocol version 2026-07-28 requires the header "mcp-param-order" for the argument "order_id"`},
		{"2026 header for an absent argument", lookup("2026-07-28", map[string]any{}, "mcp-param-order", "A-1"), `header "mcp-param-order" is set but the arguments carry no "order_id" to mirror`},
		{"2026 header for an unannotated argument", lookup("2026-07-28", map[string]any{"order_id": "A-1", "note": "n"}, "mcp-param-order", "A-1", "mcp-param-note", "n"), `header "mcp-param-note" mirrors no argument`},
		{"2026 bad base64", lookup("2026-07-28", order, "mcp-param-order", "=?base64?QS0x!?="), "not valid =?base64?…?= encoding"},
		{"2025-11-25 value disagrees", lookup("2025-11-25", order, "mcp-param-order", "B-2"), "disagrees"},
		{"2025-11-25 unannotated header", lookup("2025-11-25", order, "mcp-param-region", "eu"), `header "mcp-param-region" mirrors no argument`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.listBefore(t, tt.c)
			resp, err := f.Check(context.Background(), tt.c.request())
			if err != nil {
				t.Fatal(err)
			}
			denied := resp.GetDeniedResponse()
			switch {
			case tt.detail == "":
				if denied != nil {
					t.Fatalf("denied: %s", denied.GetBody())
				}
				return
			case tt.detail == string(deny.InvalidArguments):
				// Refused for what the schema requires, not for the header.
				if o := f.call(t, tt.c); o.reason != deny.InvalidArguments {
					t.Fatalf("reason %q, want %s", o.reason, deny.InvalidArguments)
				}
				return
			case denied == nil:
				t.Fatal("allowed")
			}
			if got := denied.GetStatus().GetCode().String(); got != "BadRequest" {
				t.Errorf("HTTP status %s, want BadRequest", got)
			}
			var body struct {
				ID    json.RawMessage `json:"id"`
				Error struct {
					Code int       `json:"code"`
					Data errorData `json:"data"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(denied.GetBody()), &body); err != nil {
				t.Fatal(err)
			}
			if string(body.ID) != "7" || body.Error.Code != -32020 || body.Error.Data.Reason != deny.HeaderMismatch {
				t.Errorf("answered id %s with code %d, reason %s; want id 7, -32020, header_mismatch", body.ID, body.Error.Code, body.Error.Data.Reason)
			}
			if !strings.Contains(body.Error.Data.Detail, tt.detail) {
				t.Errorf("detail %q, want it to contain %q", body.Error.Data.Detail, tt.detail)
			}
		})
	}
}
