package store_test

import (
	"testing"
	"time"

	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// BudgetPolicy is a refund under one daily budget, too large for a
// benchmark to exhaust.
const budgetPolicy = `
tools:
  - server: billing
    tool: refund
    effect: money_move
    budgets:
      - {name: daily_refunds, amount: args.amount, limit: 4000000000000, window: 24h}
principals:
  - id: spiffe://acme/agent/support-refund
    grants:
      - {server: billing, tools: [refund]}
`

// What one budget adds to an allowed call on the memory store: its
// reservation, and the whole term (the amount's CEL, the counter's key,
// the reservation), as the core runs it. The target is at most 1µs.
func BenchmarkMemoryBudget(b *testing.B) {
	p, err := policy.Parse([]byte(budgetPolicy))
	if err != nil {
		b.Fatal(err)
	}
	const agent = "spiffe://acme/agent/support-refund"
	d, err := p.Decide(agent, "billing", "refund")
	if err != nil {
		b.Fatal(err)
	}
	m, err := store.NewMemory(store.MemoryOptions{MaxSnapshots: 10})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(m.Close)
	b.Run("reserve", func(b *testing.B) {
		b.ReportAllocs()
		charge := policy.Charge{Counter: "spiffe://acme/agent/support-refund\x00daily_refunds", Amount: 200_000, Limit: 1 << 52, Window: 24 * time.Hour, Slot: 24 * time.Minute}
		for b.Loop() {
			if u, err := m.Reserve(charge); err != nil || !u.Allowed {
				b.Fatal(u, err)
			}
		}
	})
	b.Run("term", func(b *testing.B) {
		b.ReportAllocs()
		call := policy.Call{
			Input:    policy.Input{Args: map[string]any{"amount": 200.0}, Principal: agent, Server: "billing", Tool: "refund"},
			Counters: m,
		}
		for b.Loop() {
			if _, err := policy.Record(d.Terms, call); err != nil {
				b.Fatal(err)
			}
		}
	})
}
