package extauthz

import (
	"context"
	"io"
	"testing"

	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/cache"
)

// The hot path: one Check of an allowed tools/call under the seed's policy
// (schema, two CEL constraints, a sequence rule), a drift denial, and the
// mint at tools/list. Budget for the allowed path: 10µs and 40 allocations
// per Check on the 2-core machine; these print the figures, they do not
// assert them.
// discardAudit writes the audit trail nowhere: the fixture's buffer would
// grow by a line per iteration and the benchmark would measure that.
func discardAudit(o *Options) { o.Audit = zerolog.New(io.Discard) }

func BenchmarkCheckAllowed(b *testing.B) {
	f := packFixture(b, discardAudit)
	f.list(b, support, "billing", nil)
	f.call(b, argsCall("lookup_order", lookup))
	req := argsCall("refund", `{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`).request()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		resp, _ := f.Check(ctx, req)
		if resp.GetOkResponse() == nil {
			b.Fatal("denied")
		}
	}
}

func BenchmarkCheckDrift(b *testing.B) {
	f := packFixture(b, discardAudit)
	f.list(b, support, "billing", nil)
	f.billing.push(b, "testdata/pack/catalog-description.json", nil)
	req := argsCall("refund", `{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`).request()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		resp, _ := f.Check(ctx, req)
		if resp.GetDeniedResponse() == nil {
			b.Fatal("allowed")
		}
	}
}

func BenchmarkMint(b *testing.B) {
	// Room for every snapshot the benchmark mints: a full store refuses
	// new ones (ristretto's admission), which is measured elsewhere.
	store, err := cache.NewMemory(cache.MemoryOptions{MaxSnapshots: 200_000})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(store.Close)
	f := packFixture(b, discardAudit, func(o *Options) { o.Snapshots = store })
	req := checkCase{Principal: support, Body: listBody}.request()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		resp, _ := f.Check(ctx, req)
		if resp.GetOkResponse() == nil {
			b.Fatal("denied")
		}
	}
}
