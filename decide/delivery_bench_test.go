package decide

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/store"
)

// deliver225 is a fixture for the response path's benchmarks: a billing
// catalog of 225 tools (each about as large as make bench's generated
// ones), all classified, of which support is granted 12; a ticket for one
// tools/list; and the definitions, as the server delivers them.
func deliver225(tb testing.TB) (f *fixture, ticket string, defs []string) {
	const total, granted = 225, 12
	dir := tb.TempDir()
	defs = make([]string, total)
	var tools, grants strings.Builder
	for i := range defs {
		defs[i] = fmt.Sprintf(`{"name":"tool_%03d","description":"Tool %d of a large server: it does one thing to an order and says what it did.","inputSchema":{"type":"object","properties":{"order_id":{"type":"string","description":"The order."},"note":{"type":"string","maxLength":500},"limit":{"type":"integer","minimum":1,"maximum":100}},"required":["order_id"]},"annotations":{"readOnlyHint":true}}`, i, i)
		fmt.Fprintf(&tools, "  - {server: billing, tool: tool_%03d, effect: read}\n", i)
		if i%(total/granted) == 0 && i/(total/granted) < granted {
			if grants.Len() > 0 {
				grants.WriteString(", ")
			}
			fmt.Fprintf(&grants, "tool_%03d", i)
		}
	}
	catalogPath := filepath.Join(dir, "catalog.json")
	if err := os.WriteFile(catalogPath, []byte(`{"tools":[`+strings.Join(defs, ",")+`]}`), 0o600); err != nil {
		tb.Fatal(err)
	}
	policyPath := filepath.Join(dir, "policy.yaml")
	pol := "tools:\n" + tools.String() + "principals:\n  - id: " + support + "\n    grants:\n      - {server: billing, tools: [" + grants.String() + "]}\n"
	if err := os.WriteFile(policyPath, []byte(pol), 0o600); err != nil {
		tb.Fatal(err)
	}
	// Room for every snapshot the benchmark mints, on the fixture's clock.
	store, err := store.NewMemory(store.MemoryOptions{MaxSnapshots: 1_000_000, Now: func() time.Time { return time.Unix(1_800_000_000, 0) }})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(store.Close)
	f = newFixture(tb, discardAudit, func(o *Options) { o.Rules = mustRules(tb, policyPath); o.Snapshots = store })
	f.billing.push(tb, catalogPath, nil)

	ticket = f.ticket(tb, support, listBody)
	body := listResponse(`"l"`, "", defs...)
	out := f.Deliver(ticket, okJSON, body)
	if out.Fail != nil || len(out.Withheld) != total-granted || len(deliveredNames(tb, out.Body)) != granted {
		tb.Fatalf("fail %v, %d withheld, %d delivered", out.Fail, len(out.Withheld), len(deliveredNames(tb, out.Body)))
	}
	return f, ticket, defs
}

// Withheld tools are counted by reason, every one of them: a listing
// that withholds 213 for one reason adds 213 to its series.
func TestDeliverCountsEveryWithheld(t *testing.T) {
	f, _, defs := deliver225(t)
	if got, want := testutil.ToFloat64(f.metrics.withheld.WithLabelValues("billing", string(deny.ToolNotGranted))), float64(len(defs)-12); got != want {
		t.Errorf("tools_withheld_total{billing,tool_not_granted} = %v, want %v", got, want)
	}
	if n := testutil.CollectAndCount(f.metrics.withheld); n != 1 {
		t.Errorf("%d tools_withheld_total series, want 1", n)
	}
}

// BenchmarkDeliver225 delivers a 225-tool list of which the principal is
// granted 12, the same list on every listing, as an agent (or many) lists
// an unchanged server: the cost of reading, minting and rewriting it, and
// how much smaller the delivered list is than the server's.
func BenchmarkDeliver225(b *testing.B) {
	f, ticket, defs := deliver225(b)
	body := listResponse(`"l"`, "", defs...)
	var out *Delivery
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		out = f.Deliver(ticket, okJSON, body)
		if out.Fail != nil {
			b.Fatal(out.Fail)
		}
	}
	b.ReportMetric(float64(len(body)), "unfiltered-bytes")
	b.ReportMetric(float64(len(out.Body)), "delivered-bytes")
	b.ReportMetric(float64(len(out.Body))/float64(len(body)), "delivered/unfiltered")
}

// BenchmarkDeliver225Cold is BenchmarkDeliver225 with every definition
// in bytes never delivered before (whitespace that differs on each
// listing: the same digests, so the live view still confirms them). It is
// what a listing costs when nothing is remembered of the definitions in
// it, every one canonicalized and hashed: the price of the first listing
// of a server whose bytes capsnap's own catalog read did not already see.
func BenchmarkDeliver225Cold(b *testing.B) {
	f, ticket, defs := deliver225(b)
	fresh := make([]string, len(defs))
	var ws []byte
	b.ReportAllocs()
	for n := range b.N {
		b.StopTimer()
		// Whitespace after each definition's "{" spelling n in binary:
		// other bytes on every listing.
		ws = append(ws[:0], '\n')
		for k := n; k > 0; k >>= 1 {
			ws = append(ws, " \t"[k&1])
		}
		for i, d := range defs {
			fresh[i] = "{" + string(ws) + d[1:]
		}
		body := listResponse(`"l"`, "", fresh...)
		b.SetBytes(int64(len(body)))
		b.StartTimer()
		if out := f.Deliver(ticket, okJSON, body); out.Fail != nil || len(out.Withheld) != len(defs)-12 {
			b.Fatalf("fail %v, %d withheld", out.Fail, len(out.Withheld))
		}
	}
}
