package tooldiff

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

func BenchmarkCompare(b *testing.B) {
	rug := readCase(b, filepath.Join("testdata", "diffs", "rug_pull.txt"))
	// 200 properties, one bound raised and one property added.
	large := func(maxLength int, extra string) string {
		var props []string
		for i := range 200 {
			n := 64
			if i == 100 {
				n = maxLength
			}
			props = append(props, fmt.Sprintf(`"field_%d":{"type":"string","description":"Field %d of the order, as printed on the invoice.","maxLength":%d}`, i, i, n))
		}
		return `{"name":"bulk","description":"Update many fields of an order at once.","inputSchema":{"type":"object","properties":{` +
			strings.Join(props, ",") + extra + `},"additionalProperties":false}}`
	}
	cases := []struct{ name, old, new string }{
		{"rug_pull", rug.sections["old"], rug.sections["new"]},
		{"200_properties", large(64, ""), large(128, `,"note":{"type":"string"}`)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			old, new := definition(b, c.old), definition(b, c.new)
			b.ReportAllocs()
			for b.Loop() {
				Compare(old, new)
			}
		})
	}
}
