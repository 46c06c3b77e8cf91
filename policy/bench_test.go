package policy

import (
	"testing"
)

// Decide is on every call's path: it should be lookups, without
// allocating.
func BenchmarkDecide(b *testing.B) {
	p := mustLoad(b, "testdata/decide.yaml")
	cases := []struct{ name, principal, tool string }{
		{"exact", "spiffe://acme/agent/support-refund", "refund"},
		{"longest_prefix", "spiffe://acme/agent/ops-readonly-7", "lookup_order"},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.Decide(c.principal, "billing", c.tool); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkConstraintCheck(b *testing.B) {
	p := mustLoad(b, "testdata/seed.yaml")
	d, err := p.Decide("spiffe://acme/agent/support-refund", "billing", "refund")
	if err != nil {
		b.Fatal(err)
	}
	in := Input{
		Args:      jsonArgs(b, `{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"}`),
		Principal: "spiffe://acme/agent/support-refund", Server: "billing", Tool: "refund",
	}
	for _, c := range constraintsOf(d) {
		b.Run(c.Name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.CheckInput(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
