package policy_test

import (
	"fmt"
	"time"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// The daily cap of docs/POLICY.md: refunds of USD 200 under a USD 500
// daily budget, on the memory store's counters. The third is denied, takes
// nothing, and says when it fits: when the first refund's slot stops
// counting, 24h after the end of the 24-minute slot it was taken in.
func ExampleBudget_dailyCap() {
	p, err := policy.Parse([]byte(`
tools:
  - server: billing
    tool: refund
    effect: money_move
    constraints:
      - {name: usd_cap_250, expr: "args.amount <= 250"}
    budgets:
      - {name: daily_refunds, amount: args.amount, limit: 500, window: 24h}
principals:
  - id: spiffe://acme/agent/support-refund
    grants:
      - {server: billing, tools: [refund]}
`))
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	store, err := store.NewMemory(store.MemoryOptions{MaxSnapshots: 10, Now: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	const agent = "spiffe://acme/agent/support-refund"
	d, err := p.Decide(agent, "billing", "refund")
	if err != nil {
		panic(err)
	}
	for range 3 {
		call := policy.Call{
			Input:    policy.Input{Args: map[string]any{"amount": 200.0}, Principal: agent, Server: "billing", Tool: "refund"},
			Counters: store,
		}
		taken, err := policy.Record(d.Terms, call)
		if de, ok := deny.As(err); ok {
			fmt.Printf("%s refund 200: %s; retry after %ss (at %s)\n", now.Format("15:04"), de, de.Limit.RetryAfter(),
				now.Add(time.Duration(de.Limit.RetryAfterSeconds)*time.Second).Format("Jan 2 15:04"))
		} else {
			fmt.Printf("%s refund 200: allowed, %s %q took %d thousandths\n", now.Format("15:04"), taken[0].Kind, taken[0].Name, taken[0].Amount)
		}
		now = now.Add(time.Hour)
	}
	// Output:
	// 09:00 refund 200: allowed, budget "daily_refunds" took 200000 thousandths
	// 10:00 refund 200: allowed, budget "daily_refunds" took 200000 thousandths
	// 11:00 refund 200: budget_exhausted: budget "daily_refunds" holds 400 of 500 per 24h; this call's 200 would exceed it: retry in 79920s; retry after 79920s (at Mar 3 09:12)
}
