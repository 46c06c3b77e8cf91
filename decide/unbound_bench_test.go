package decide

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// BenchmarkCheckList is the Check of a tools/list on the response path:
// the live catalog, the store's sequence, the ticket sealed and watched.
func BenchmarkCheckList(b *testing.B) {
	benchmarkCheck(b, deliveryFixture(b, "", discardAudit), checkCase{Principal: support, Body: listBody}.request())
}

// BenchmarkTicketWatch is what watching a listing costs the hot path: its
// ticket watched at the Check and let go at its Deliver, from every CPU at
// once, as many agents list, with the sweep of what fell due in between.
func BenchmarkTicketWatch(b *testing.B) {
	u := newUnbound([]string{"billing"}, nil, nil, true)
	start := time.Unix(1_800_000_000, 0)
	var n atomic.Int64
	tickets := make([]string, 1<<12)
	for i := range tickets {
		// Unique in the MAC's first 16 characters, as every ticket's is.
		tickets[i] = "eyJwIjoic3BpZmZlOi8vYWNtZS9hZ2VudCJ9." + fmt.Sprintf("%016x", i) + "Rest0fTheMac"
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			// A thousand listings a (simulated) second.
			now := start.Add(time.Duration(i) * time.Millisecond)
			t := tickets[i%int64(len(tickets))]
			u.issued("billing", t, now)
			u.redeemed("billing", t, now)
			if i%1000 == 0 {
				u.sweep(now, zerolog.Nop())
			}
		}
	})
}
