package main

import (
	"fmt"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The generated tools of tools=N: a resource, an action on it and a tenant
// region, in turn, so that neighbouring tools differ and their definitions
// read like a real back office's.

type genResource struct {
	noun, plural, id, example string
}

var genResources = []genResource{
	{"invoice", "invoices", "invoice_id", "INV-2041"},
	{"customer account", "customer accounts", "account_id", "AC-1042"},
	{"shipment", "shipments", "shipment_id", "SH-88120"},
	{"support ticket", "support tickets", "ticket_id", "T-5531"},
	{"subscription", "subscriptions", "subscription_id", "SUB-771"},
	{"product", "products", "sku", "SKU-30-114"},
	{"warehouse", "warehouses", "warehouse_id", "WH-EU-2"},
	{"payment", "payments", "payment_id", "PAY-90213"},
	{"contract", "contracts", "contract_id", "CT-2024-17"},
	{"purchase order", "purchase orders", "po_number", "PO-44120"},
	{"user", "users", "user_id", "U-1203"},
	{"report", "reports", "report_id", "R-311"},
	{"coupon", "coupons", "coupon_code", "SPRING25"},
	{"return", "returns", "return_id", "RMA-8812"},
	{"ledger entry", "ledger entries", "entry_id", "LE-55120"},
}

var genRegions = []string{"EU", "US", "APAC"}

type genAction struct {
	// describe is the description's first sentence, schema the
	// inputSchema.
	describe func(genResource) string
	schema   func(genResource) map[string]any
}

func genString(d string) map[string]any { return map[string]any{"type": "string", "description": d} }

func genObject(props map[string]any, required ...any) map[string]any {
	return map[string]any{"type": "object", "properties": props, "required": required}
}

var genActions = []genAction{
	{
		describe: func(r genResource) string {
			return fmt.Sprintf("Look up one %s by its id and return its current fields.", r.noun)
		},
		schema: func(r genResource) map[string]any {
			return genObject(map[string]any{
				r.id:              genString(fmt.Sprintf("The %s, such as %s.", r.noun, r.example)),
				"include_history": map[string]any{"type": "boolean", "description": "Also return its change history."},
			}, r.id)
		},
	},
	{
		describe: func(r genResource) string {
			return fmt.Sprintf("List %s, newest first, by status.", r.plural)
		},
		schema: func(genResource) map[string]any {
			return genObject(map[string]any{
				"status": map[string]any{"type": "string", "enum": []any{"open", "pending", "closed"}},
				"since":  map[string]any{"type": "string", "format": "date-time", "description": "Changed after this time."},
				"limit":  map[string]any{"type": "integer", "minimum": 1, "maximum": 100},
			}, "status")
		},
	},
	{
		describe: func(r genResource) string {
			return fmt.Sprintf("Update one %s; omitted fields stay as they are.", r.noun)
		},
		schema: func(r genResource) map[string]any {
			return genObject(map[string]any{
				r.id:     genString(fmt.Sprintf("The %s.", r.noun)),
				"fields": map[string]any{"type": "object", "description": "New values by name."},
				"note":   map[string]any{"type": "string", "maxLength": 500},
			}, r.id, "fields")
		},
	},
	{
		describe: func(r genResource) string {
			return fmt.Sprintf("Archive one %s, hiding it from listings.", r.noun)
		},
		schema: func(r genResource) map[string]any {
			return genObject(map[string]any{
				r.id:           genString(fmt.Sprintf("The %s.", r.noun)),
				"reason":       map[string]any{"type": "string", "enum": []any{"duplicate", "obsolete"}},
				"notify":       map[string]any{"type": "boolean"},
				"effective_on": map[string]any{"type": "string", "format": "date"},
			}, r.id, "reason")
		},
	},
	{
		describe: func(r genResource) string {
			return fmt.Sprintf("Export the %s changed since a date.", r.plural)
		},
		schema: func(genResource) map[string]any {
			return genObject(map[string]any{
				"format": map[string]any{"type": "string", "enum": []any{"csv", "json"}},
				"since":  map[string]any{"type": "string", "format": "date", "description": "The first day to include."},
			}, "format", "since")
		},
	},
}

// generatedTools are tools=n's tools, tool_001 to tool_n.
func generatedTools(n int) []*mcp.Tool {
	width := max(3, len(strconv.Itoa(n)))
	out := make([]*mcp.Tool, 0, n)
	for i := range n {
		r := genResources[i%len(genResources)]
		a := genActions[(i/len(genResources))%len(genActions)]
		region := genRegions[(i/(len(genResources)*len(genActions)))%len(genRegions)]
		t := &mcp.Tool{
			Name:        fmt.Sprintf("tool_%0*d", width, i+1),
			Description: fmt.Sprintf("%s %s tenant only.", a.describe(r), region),
			InputSchema: a.schema(r),
		}
		out = append(out, t)
	}
	return out
}
