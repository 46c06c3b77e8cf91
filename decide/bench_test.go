package decide

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/store"
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
	benchmarkAllowed(b, packFixture(b, discardAudit))
}

// benchmarkAllowed lists tools and looks the order up, so that the refund's
// sequence rule holds, then measures the allowed refund. Two seconds pass
// in between, as an agent's planning takes them: on the Redis store a
// replica reads a pointer it moved itself from Redis for a second after
// (store/redis movedWindow), and the fixture's clock would otherwise
// hold every Check inside that second.
func benchmarkAllowed(b *testing.B, f *fixture) {
	f.list(b, support, "billing", nil)
	f.call(b, argsCall("lookup_order", lookup))
	f.clock.advance(2 * time.Second)
	benchmarkCheck(b, f, argsCall("refund", `{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`).request())
}

// benchmarkCheck measures f's Check of req, which must be allowed.
func benchmarkCheck(b *testing.B, f *fixture, req *authv3.CheckRequest) {
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
	store, err := store.NewMemory(store.MemoryOptions{MaxSnapshots: 1_000_000})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(store.Close)
	// The mint at the request (discovery.bind catalog); a mint on the
	// response path is BenchmarkDeliver225.
	f := packFixture(b, discardAudit, func(o *Options) { o.Snapshots, o.Bind = store, config.BindCatalog })
	benchmarkCheck(b, f, checkCase{Principal: support, Body: listBody}.request())
}

// BenchmarkCheckCatalogSize is the allowed Check against catalogs of 10,
// 225 and 100,000 tools (the seed's two among fillers the policy does not
// grant): a call's cost must not grow with the catalog it is checked in.
func BenchmarkCheckCatalogSize(b *testing.B) {
	seed := readTools(b, "testdata/pack/catalog.json")
	for _, n := range []int{10, 225, 100_000} {
		b.Run(fmt.Sprintf("tools=%d", n), func(b *testing.B) {
			// Minted from the catalog: a 100,000-tool list is over any
			// response a server would deliver, and the call is what is
			// measured.
			f := packFixture(b, discardAudit, func(o *Options) { o.Bind = config.BindCatalog })
			tools := append([]json.RawMessage(nil), seed...)
			for i := len(tools); i < n; i++ {
				tools = append(tools, json.RawMessage(fmt.Sprintf(`{"name":"filler_%06d","description":"One of many.","inputSchema":{"type":"object","properties":{"id":{"type":"string"}}}}`, i)))
			}
			f.billing.publish(tools, nil)
			list, _, err := f.catalog.Lookup("billing")
			if err != nil {
				b.Fatal(err)
			}
			if len(list.Tools) != n {
				b.Fatalf("the catalog holds %d tools, want %d", len(list.Tools), n)
			}
			benchmarkAllowed(b, f)
		})
	}
}

// BenchmarkSnapshotsLive mints n snapshots, one per agent session, then
// measures a Check against one of them, picked in turn, and reports the
// heap each live snapshot costs (store, pins, indexes and all). The
// million is skipped under -short, as make bench-smoke runs it.
func BenchmarkSnapshotsLive(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("snapshots=%d", n), func(b *testing.B) {
			if testing.Short() && n > 100_000 {
				b.Skip("a million snapshots take a minute to mint; make bench runs them")
			}
			before := liveHeap()
			store, err := store.NewMemory(store.MemoryOptions{MaxSnapshots: int64(n)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(store.Close)
			// Minted at the request (discovery.bind catalog), n at a time.
			f := packFixture(b, discardAudit, func(o *Options) { o.Snapshots, o.Bind = store, config.BindCatalog })
			epochs := mintSessions(b, f, n)
			if held := store.Held(); held != int64(n) {
				b.Fatalf("the store holds %d of %d snapshots", held, n)
			}
			perSnapshot := float64(liveHeap()-before) / float64(n)
			benchmarkAmong(b, f, epochs)
			b.ReportMetric(perSnapshot, "B/snapshot")
			runtime.KeepAlive(epochs)
		})
	}
}

// mintSessions lists tools on f in n agent sessions (sessionID(i)), which
// mints a snapshot in each at the request (discovery.bind catalog), and
// returns their epochs.
func mintSessions(b *testing.B, f *fixture, n int) []string {
	ctx := context.Background()
	epochs := make([]string, n)
	for i := range epochs {
		list := checkCase{Principal: support, Body: listBody, Headers: map[string]string{"mcp-session-id": sessionID(i)}}
		resp, _ := f.Check(ctx, list.request())
		if resp.GetOkResponse() == nil {
			b.Fatalf("mint %d of %d denied: %s", i, n, resp.GetDeniedResponse().GetBody())
		}
		epochs[i] = okHeader(resp, HeaderEpoch)
	}
	return epochs
}

func sessionID(i int) string { return fmt.Sprintf("session-%07d", i) }

// benchmarkAmong measures a Check of lookup_order on f under one of
// epochs, picked in turn.
func benchmarkAmong(b *testing.B, f *fixture, epochs []string) {
	reqs := make([]*authv3.CheckRequest, 1024)
	for i := range reqs {
		c := argsCall("lookup_order", lookup)
		c.Headers = map[string]string{HeaderEpoch: epochs[(i*7919)%len(epochs)]}
		reqs[i] = c.request()
	}
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		resp, _ := f.Check(ctx, reqs[i%len(reqs)])
		if resp.GetOkResponse() == nil {
			b.Fatalf("denied: %s", resp.GetDeniedResponse().GetBody())
		}
		i++
	}
}

// liveHeap is the heap in use after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
