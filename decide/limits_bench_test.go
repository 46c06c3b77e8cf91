package decide

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/testbed"
)

// budgetedPack is the pack's policy with a budget on refund whose limit no
// benchmark reaches: every Check takes its amount, none is refused.
func budgetedPack(b *testing.B) func(*Options) {
	return func(o *Options) {
		const after = "args.reason_code in ['duplicate_charge', 'not_received', 'damaged']\"}\n"
		pack, err := os.ReadFile("testdata/pack/policy.yaml")
		if err != nil || strings.Count(string(pack), after) != 1 {
			b.Fatalf("testdata/pack/policy.yaml: refund's constraints are not where the budget goes (%v)", err)
		}
		budgeted := strings.Replace(string(pack), after, after+"    budgets:\n      - {name: daily_refunds, amount: args.amount, limit: 1000000000, window: 24h}\n", 1)
		path := filepath.Join(b.TempDir(), "policy.yaml")
		if err := os.WriteFile(path, []byte(budgeted), 0o644); err != nil {
			b.Fatal(err)
		}
		o.Rules = mustRules(b, path)
	}
}

// BenchmarkCheckBudget is BenchmarkCheckAllowed's refund under a budget
// too: on the memory store what its reservation adds in process, on Redis
// its one round trip (redis-cmds/op beside BenchmarkCheckStore/redis's,
// which holds the snapshot and reads refund's sequence rule in Redis).
func BenchmarkCheckBudget(b *testing.B) {
	b.Run("memory", func(b *testing.B) {
		benchmarkAllowed(b, packFixture(b, discardAudit, budgetedPack(b)))
	})
	b.Run("redis", func(b *testing.B) {
		r := testbed.StartRedis(b)
		f := packFixture(b, discardAudit, onRedis(b, r, newPrefix()), budgetedPack(b))
		countRedis(b, r, func() { benchmarkAllowed(b, f) })
	})
}

// countRedis runs bench and reports, a Check, the Redis commands processed
// (redis-cmds/op, those a script runs included) and the scripts run
// (redis-scripts/op). Each of capsnap's operations on Redis is one command
// (a script, or a single read or write), a round trip: what a Check adds
// in round trips is what it adds in scripts and in commands outside them,
// give or take the store's health probe every half second.
func countRedis(b *testing.B, r *testbed.Redis, bench func()) {
	b.Helper()
	stats := func() (commands, scripts float64) {
		info, err := r.Do("INFO", "all")
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			line = strings.TrimSpace(line)
			if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
				commands, _ = strconv.ParseFloat(v, 64)
			}
			for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
				if v, ok := strings.CutPrefix(line, cmd); ok {
					n, _ := strconv.ParseFloat(v[:strings.IndexByte(v+",", ',')], 64)
					scripts += n
				}
			}
		}
		return commands, scripts
	}
	c0, s0 := stats()
	bench()
	c1, s1 := stats()
	// The first INFO is one of the commands.
	b.ReportMetric((c1-c0-1)/float64(b.N), "redis-cmds/op")
	b.ReportMetric((s1-s0)/float64(b.N), "redis-scripts/op")
}
