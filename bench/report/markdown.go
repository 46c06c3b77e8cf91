package report

import (
	_ "embed"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/capsnap/capsnap/bench/gobench"
	"github.com/capsnap/capsnap/bench/mcpload"
)

// Markdown renders BENCHMARKS.md. svgPath is the latency chart's path
// relative to the repository root.
func Markdown(r *Results, svgPath string) []byte {
	var b strings.Builder
	sections := []func(*strings.Builder, *Results){
		header, machine, targets, storeFigures, grpcSection(svgPath), envelopeSection, envoySection, deliverySection, scaleSection, hotPathSection, invalidationSection, storeSection, missedSection, leversSection, methodSection,
	}
	for i, s := range sections {
		if i > 0 {
			b.WriteString("\n")
		}
		s(&b, r)
	}
	return []byte(b.String())
}

func header(b *strings.Builder, r *Results) {
	fmt.Fprintf(b, "# Benchmarks\n\n")
	fmt.Fprintf(b, "<!-- Written by `make bench` (bench/cmd/bench): change the harness, not this file. -->\n\n")
	fmt.Fprintf(b, "The figures of one `make bench` run, started %s and taking %s. "+
		"Every case ran in that one run, one after another, so that ratios between them hold on a noisy machine. "+
		"Rerun with `make bench`; the raw results are in `bench/out/results.json` and every process's log in `bench/out/logs/` (neither committed).\n",
		r.Started.UTC().Format("2006-01-02 15:04 MST"), r.Elapsed.Round(time.Second))
}

func machine(b *strings.Builder, r *Results) {
	m := r.Machine
	fmt.Fprintf(b, "## Machine\n\n")
	table(b, []string{"", ""}, [][]string{
		{"CPU", m.CPU}, {"cores", fmt.Sprint(m.Cores)}, {"kernel", m.Kernel}, {"Go", m.Go},
		{"Envoy", m.Envoy}, {"OPA-Envoy", m.OPA}, {"Redis", m.Redis}, {"date", m.Date},
		{"load average at start", m.LoadAvg},
	})
	fmt.Fprintf(b, "\nThe load generator (checkload, or the harness's MCP client through Envoy) shares these %d cores with the servers it measures, "+
		"and the machine may be running other work: every figure includes that contention, and the servers are compared within one run for that reason.\n", m.Cores)
}

func targets(b *strings.Builder, r *Results) {
	fmt.Fprintf(b, "## Targets (issues 17 and 7)\n\n")
	var rows [][]string
	for _, t := range r.Targets {
		rows = append(rows, []string{fmt.Sprint(t.Issue), t.Name, t.Threshold, t.Measured, "**" + string(t.Status) + "**"})
	}
	table(b, []string{"issue", "target", "threshold", "this run", "status"}, rows)
}

func grpcSection(svgPath string) func(*strings.Builder, *Results) {
	return func(b *strings.Builder, r *Results) {
		fmt.Fprintf(b, "## Check over gRPC\n\n")
		fmt.Fprintf(b, "The load (`bench/cmd/checkload`) sends the same allowed `tools/call` CheckRequest to each server: capsnap, the floor (a do-nothing ext_authz server, `bench/noop`) and OPA-Envoy running `bench/opa/policy.rego`. It decodes every answer in full with protobuf-go's generated code, as Envoy decodes it with its own. See [The load, and ghz](#the-load-and-ghz) for why it replaced ghz.\n\n")
		fmt.Fprintf(b, "![p50 and p99 latency per server and concurrency](%s)\n\n", svgPath)
		cs := r.Method.Concurrencies
		byServer := func(f func(GRPCRun) string) [][]string {
			var rows [][]string
			for _, c := range cs {
				row := []string{fmt.Sprint(c)}
				for _, s := range Servers {
					g, _ := r.Run(s, c)
					row = append(row, f(g))
				}
				rows = append(rows, row)
			}
			return rows
		}
		withRatio := func(rows [][]string, f func(c int) string) [][]string {
			for i, c := range cs {
				rows[i] = append(rows[i], f(c))
			}
			return rows
		}
		ratio := func(num, den func(GRPCRun) float64, a, z string) func(int) string {
			return func(c int) string {
				x, _ := r.Run(a, c)
				y, _ := r.Run(z, c)
				if den(y) == 0 {
					return "–"
				}
				return fmt.Sprintf("%.2f×", num(x)/den(y))
			}
		}
		rps := func(g GRPCRun) float64 { return g.RPS }
		p50 := func(g GRPCRun) float64 { return float64(g.P50) }
		p99 := func(g GRPCRun) float64 { return float64(g.P99) }
		cpu := func(g GRPCRun) float64 { return float64(g.CPUPerCheck) }

		fmt.Fprintf(b, "### Throughput (Checks per second)\n\n")
		table(b, append(append([]string{"concurrency"}, Servers...), "capsnap ÷ floor"),
			withRatio(byServer(func(g GRPCRun) string { return fmt.Sprintf("%.0f", g.RPS) }), ratio(rps, rps, Capsnap, Floor)))
		fmt.Fprintf(b, "\n### Latency, p50\n\n")
		table(b, append(append([]string{"concurrency"}, Servers...), "capsnap ÷ floor"),
			withRatio(byServer(func(g GRPCRun) string { return Dur(g.P50) }), ratio(p50, p50, Capsnap, Floor)))
		fmt.Fprintf(b, "\n### Latency, p99\n\n")
		table(b, append(append([]string{"concurrency"}, Servers...), "capsnap ÷ floor"),
			withRatio(byServer(func(g GRPCRun) string { return Dur(g.P99) }), ratio(p99, p99, Capsnap, Floor)))
		fmt.Fprintf(b, "\n### Server CPU time per Check\n\n")
		table(b, append(append([]string{"concurrency"}, Servers...), "capsnap ÷ OPA-Envoy"),
			withRatio(byServer(func(g GRPCRun) string { return Dur(g.CPUPerCheck) }), ratio(cpu, cpu, Capsnap, OPA)))
		for _, live := range r.Live {
			fmt.Fprintf(b, "\n### Where a Check's server CPU goes, at concurrency %d\n\n", live.Concurrency)
			fmt.Fprintf(b, "From CPU profiles of the running capsnap and floor (see the notes on missed targets), each part's samples divided by the Checks made while it was profiled; approximate, as the profiles sample at 100 Hz.\n\n")
			var rows [][]string
			var sumC, sumF time.Duration
			for _, p := range live.CPUBreakdown {
				rows = append(rows, []string{p.Part, Dur(p.Capsnap), Dur(p.Floor), signedDur(p.Capsnap - p.Floor)})
				sumC, sumF = sumC+p.Capsnap, sumF+p.Floor
			}
			rows = append(rows, []string{"all", Dur(sumC), Dur(sumF), signedDur(sumC - sumF)})
			table(b, []string{"part", "capsnap", "floor (noop)", "capsnap − floor"}, rows)
		}
		fmt.Fprintf(b, "\n### Server resident memory after the run (peak)\n\n")
		table(b, append([]string{"concurrency"}, Servers...),
			byServer(func(g GRPCRun) string { return fmt.Sprintf("%s (%s)", mib(g.Memory.RSS), mib(g.Memory.Peak)) }))
		fmt.Fprintf(b, "\n### Every run\n\n")
		var rows [][]string
		for _, g := range r.GRPC {
			rows = append(rows, []string{g.Server, fmt.Sprint(g.Concurrency), fmt.Sprint(g.Count), Dur(g.Total),
				Dur(g.Mean), Dur(g.Slowest), Dur(g.CPU), orDash(g.ClientPerCheck()), fmt.Sprint(errorCount(g))})
		}
		table(b, []string{"server", "concurrency", "Checks", "measured time", "mean", "slowest", "server CPU", "the load's CPU per Check", "errors"}, rows)
		ghzSection(b, r)
	}
}

// ghzSection says why the load is not ghz, and why ghz no longer runs
// beside it.
func ghzSection(b *strings.Builder, r *Results) {
	fmt.Fprintf(b, "\n### The load, and ghz\n\n")
	fmt.Fprintf(b, "Until issue 17 the load was ghz. ghz decodes each answer into a dynamic message (protoreflect), whose cost grows with the answer's fields, not with the server's work: "+
		"capsnap's allowed answer carries its pins as seven upstream headers (and carried them again, until issue 17, in seven entries of dynamic metadata), the floor's carries nothing. "+
		"So under ghz the load, which shares the %d cores, spent far more per Check of capsnap than of the floor, and the throughput ratio measured ghz's decoder more than either server. "+
		"The load now decodes as Envoy does, with generated code. "+
		"Until issue 28 ghz still ran once, on capsnap and the floor at the highest concurrency, as a cross-check; it no longer runs. "+
		"Every run had shown the same: ghz spending two to three times the load's CPU per Check, and more of it on capsnap's answers than on the floor's, so that it measured ghz rather than either server, at the price of a pinned peer to install and a step of the run. "+
		"Its figures beside the load's are in the levers below and in this file's history.\n", r.Machine.Cores)
}

// orDash is d, or – if nothing was measured.
func orDash(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return Dur(d)
}

func envoySection(b *strings.Builder, r *Results) {
	fmt.Fprintf(b, "## Through the real Envoy\n\n")
	fmt.Fprintf(b, "%d MCP sessions post `%s` through Envoy to billing, with no ext_authz filter, with ext_authz to the floor, and with ext_authz to capsnap (the same filter settings, from `envoy/demo.yaml`); "+
		"then, on the shared snapshot store, to capsnap on Redis and to two capsnap replicas sharing that Redis behind one cluster (see [Shared snapshot store](#shared-snapshot-store-redis)). "+
		"Added latency is over the run without ext_authz. Every call of these runs succeeded: one that did not would have failed the benchmark. "+
		"In capsnap's modes every answer also goes through capsnap's ext_proc service, which screens it for a `tools/list` result on a stream not its own (issue 27: a client takes one on any stream for its pending listing); "+
		"the floor leaves no decision in Envoy's metadata, so its Envoy skips that filter. The difference between the two is ext_authz and the response path together.\n\n", r.Method.EnvoyWorkers, r.Method.EnvoyCall)
	none, _ := r.Mode(ModeNone)
	var rows [][]string
	for _, m := range append(slices.Clone(Modes), StoreModes...) {
		e, ok := r.Mode(m)
		if !ok && slices.Contains(StoreModes, m) {
			continue
		}
		added50, added99 := "–", "–"
		if m != ModeNone {
			added50, added99 = signed(e.P50-none.P50), signed(e.P99-none.P99)
		}
		rows = append(rows, []string{m, fmt.Sprintf("%.0f", e.RPS), Dur(e.P50), Dur(e.P99), Dur(e.Mean), Dur(e.Max), added50, added99,
			fmt.Sprint(e.Calls)})
	}
	table(b, []string{"mode", "calls/s", "p50", "p99", "mean", "max", "added p50", "added p99", "calls"}, rows)

	var cpu []cpuRow
	for _, e := range r.Envoy {
		if len(e.CPU) > 0 {
			cpu = append(cpu, cpuRow{e.Mode, e.CPU})
		}
	}
	if len(cpu) > 0 {
		fmt.Fprintf(b, "\n### Where a call's CPU goes\n\n"+
			"Each process's CPU time (user + system, from `/proc`) over the mode's turns, divided by the mode's calls. "+
			"The processes share the machine's cores, so what one spends on a call is taken from the others. "+
			"The authorizer is the ext_authz server (both replicas in the last mode); the load is the harness's own process, its MCP clients.\n\n")
		cpuTable(b, "mode", cpu, ModeCapsnap, ModeFloor, "capsnap − floor")
	}
}

// cpuRow is one mode's split of a call's CPU among processes.
type cpuRow struct {
	mode string
	cpu  []ProcessCPU
}

// cpuTable writes each row's CPU per call, by process and in all, and a
// last row (named label) of what mode more adds over mode base.
func cpuTable(b *strings.Builder, first string, rows []cpuRow, more, base, label string) {
	// The columns in the order of the row with the most processes, the
	// others' after.
	var procs []string
	byCount := slices.Clone(rows)
	slices.SortStableFunc(byCount, func(a, b cpuRow) int { return len(b.cpu) - len(a.cpu) })
	for _, r := range byCount {
		for _, p := range r.cpu {
			if !slices.Contains(procs, p.Process) {
				procs = append(procs, p.Process)
			}
		}
	}
	perCall := func(r cpuRow, process string) time.Duration {
		for _, p := range r.cpu {
			if p.Process == process {
				return p.PerCall
			}
		}
		return 0
	}
	var out [][]string
	var m, bs *cpuRow
	for i, r := range rows {
		line, all := []string{r.mode}, time.Duration(0)
		for _, p := range procs {
			d := perCall(r, p)
			all += d
			line = append(line, orDash(d))
		}
		out = append(out, append(line, Dur(all)))
		switch r.mode {
		case more:
			m = &rows[i]
		case base:
			bs = &rows[i]
		}
	}
	if m != nil && bs != nil {
		line, all := []string{label}, time.Duration(0)
		for _, p := range procs {
			d := perCall(*m, p) - perCall(*bs, p)
			all += d
			line = append(line, signed(d))
		}
		out = append(out, append(line, signed(all)))
	}
	table(b, append(append([]string{first}, procs...), "all"), out)
}

func deliverySection(b *strings.Builder, r *Results) {
	d := r.Delivery
	fmt.Fprintf(b, "## tools/list through the response path\n\n")
	if !d.Ran() {
		fmt.Fprintf(b, "Not run.\n")
		return
	}
	fmt.Fprintf(b, "One principal (`%s`) lists the tools of a server that offers %d (`testbed/cmd/mcpfixture -mode json,tools=%d`: generated definitions, a description and 2 to 4 typed properties each), under a policy that classifies all %d and grants it %d. "+
		"Two Envoys run `envoy/demo.yaml`, identical but for the response path: one with its `capsnap.ext_proc` filter, beside a capsnap that binds snapshots to what is delivered (`discovery.bind: delivered`, the default) and rewrites the list to the granted tools; "+
		"one without that filter, beside a capsnap with `discovery: {bind: catalog}`, which mints at the request from its own view and lets the server's whole list through. "+
		"Each listing is one stateless MCP 2026-07-28 `tools/list`; every one must come back 200 with an `x-capsnap-epoch` and exactly %d tools with the response path, %d without, or the benchmark fails.\n\n",
		d.Principal, d.CatalogTools, d.CatalogTools, d.CatalogTools, d.GrantedTools, d.GrantedTools, d.CatalogTools)

	fmt.Fprintf(b, "### What the agent is delivered\n\n")
	table(b, []string{"one tools/list", "tools", "body bytes", "≈ tokens (bytes ÷ 4)"}, [][]string{
		{"without the response path", fmt.Sprint(d.CatalogTools), thousands(d.UnfilteredBytes), thousands(d.UnfilteredBytes / 4)},
		{"with the response path", fmt.Sprint(d.GrantedTools), thousands(d.FilteredBytes), thousands(d.FilteredBytes / 4)},
	})
	if d.FilteredBytes > 0 && d.UnfilteredBytes > 0 {
		fmt.Fprintf(b, "\nWith the response path the agent is delivered %.1f%% of the bytes: %.1f× fewer, %s bytes (≈ %s tokens) less on every listing. ",
			100*float64(d.FilteredBytes)/float64(d.UnfilteredBytes), float64(d.UnfilteredBytes)/float64(d.FilteredBytes),
			thousands(d.UnfilteredBytes-d.FilteredBytes), thousands((d.UnfilteredBytes-d.FilteredBytes)/4))
	}
	fmt.Fprintf(b, "Tokens are estimated as bytes ÷ 4, a rule of thumb for English and JSON, not a tokenizer's count. The server's own response, straight from it, is %s bytes.\n\n", thousands(d.UpstreamBytes))

	fmt.Fprintf(b, "### What it costs\n\n")
	fmt.Fprintf(b, "%d workers list concurrently, each on its own connection; after %d discarded listings per Envoy, the two take %s, each turn %d listings or %v, whichever comes first. Added latency is over the Envoy without the response path.\n\n",
		d.Workers, d.Warmup, takingTurns(r.Method.Turns), d.Listings/r.Method.Turns, d.Turn)
	var rows [][]string
	for _, m := range []struct {
		name string
		res  mcpload.Result
		with bool
	}{{"without the response path", d.Without, false}, {"with the response path", d.With, true}} {
		added50, added99 := "–", "–"
		if m.with {
			added50, added99 = signed(d.With.P50-d.Without.P50), signed(d.With.P99-d.Without.P99)
		}
		rows = append(rows, []string{m.name, fmt.Sprint(m.res.Calls), fmt.Sprintf("%.0f", m.res.RPS), Dur(m.res.P50), Dur(m.res.P90), Dur(m.res.P99),
			Dur(m.res.Mean), Dur(m.res.Max), added50, added99})
	}
	table(b, []string{"Envoy", "listings", "listings/s", "p50", "p90", "p99", "mean", "max", "added p50", "added p99"}, rows)
	t := DeliveryTarget(d)
	fmt.Fprintf(b, "\nIssue 17's target: %s %s. This run: %s, **%s**.\n", t.Name, t.Threshold, t.Measured, t.Status)
	if len(d.WithCPU) > 0 && len(d.WithoutCPU) > 0 {
		const with, without = "with the response path", "without the response path"
		fmt.Fprintf(b, "\n### Where a listing's CPU goes\n\n"+
			"Each process's CPU time (user + system, from `/proc`) over the Envoy's turns, divided by its listings. "+
			"The processes share the machine's cores, so what one spends on a listing is taken from the others. "+
			"The load is the harness's own process: its HTTP clients, which read and parse each list.\n\n")
		cpuTable(b, "mode", []cpuRow{{without, d.WithoutCPU}, {with, d.WithCPU}}, with, without, "added by the response path")
	}
}

func scaleSection(b *strings.Builder, r *Results) {
	fmt.Fprintf(b, "## Scale (Go benchmarks, `decide`)\n\n")
	fmt.Fprintf(b, "### Catalog size: the allowed Check against catalogs of n tools\n\n")
	base, hasBase := gobench.Find(r.Scale, fmt.Sprintf(BenchCatalogSize, CatalogSizes[0]))
	var rows [][]string
	for _, n := range CatalogSizes {
		res, ok := gobench.Find(r.Scale, fmt.Sprintf(BenchCatalogSize, n))
		if !ok {
			rows = append(rows, []string{fmt.Sprint(n), "not run", "", "", ""})
			continue
		}
		vs := "–"
		if hasBase {
			vs = fmt.Sprintf("%.2f×", res.Metrics["ns/op"]/base.Metrics["ns/op"])
		}
		rows = append(rows, []string{fmt.Sprint(n), nsop(res), vs, metric(res, "B/op"), metric(res, "allocs/op")})
	}
	table(b, []string{"tools", "per Check", "× 10 tools", "B/op", "allocs/op"}, rows)

	fmt.Fprintf(b, "\n### Live snapshots: a Check among n snapshots, and the heap each holds\n\n")
	rows = nil
	for _, n := range SnapshotCounts {
		res, ok := gobench.Find(r.Scale, fmt.Sprintf(BenchSnapshots, n))
		if !ok {
			rows = append(rows, []string{fmt.Sprint(n), "not run", "", ""})
			continue
		}
		per, has := res.Metrics["B/snapshot"]
		million := "–"
		if has {
			million = fmt.Sprintf("%.2f GiB", per*1e6/(1<<30))
		}
		rows = append(rows, []string{fmt.Sprint(n), nsop(res), metric(res, "B/snapshot"), million})
	}
	table(b, []string{"snapshots", "per Check", "B/snapshot", "× 1,000,000"}, rows)
}

func hotPathSection(b *strings.Builder, r *Results) {
	fmt.Fprintf(b, "## Hot path (Go benchmarks)\n\n")
	if len(r.HotPath) == 0 {
		fmt.Fprintf(b, "Not run: no benchmark found.\n")
		return
	}
	var rows [][]string
	for _, res := range r.HotPath {
		var other []string
		for unit, v := range res.Metrics {
			if unit != "ns/op" && unit != "B/op" && unit != "allocs/op" {
				other = append(other, fmt.Sprintf("%g %s", v, unit))
			}
		}
		sort.Strings(other)
		rows = append(rows, []string{strings.TrimPrefix(res.Pkg, "github.com/capsnap/capsnap/"), res.Name, nsop(res),
			metric(res, "B/op"), metric(res, "allocs/op"), strings.Join(other, ", ")})
	}
	table(b, []string{"package", "benchmark", "per op", "B/op", "allocs/op", "other"}, rows)
}

func invalidationSection(b *strings.Builder, r *Results) {
	inv := r.Invalidation
	fmt.Fprintf(b, "## Invalidation\n\n")
	fmt.Fprintf(b, "Through the real Envoy, %d times: list tools (a fresh snapshot), call refund (allowed), then redeploy billing (`POST /admin/variant`, which sends `notifications/tools/list_changed`) and call refund again and again until capsnap denies it `schema_drift`. "+
		"Measured from just before the redeploy's POST to that denial.\n\n", len(inv.Trials))
	table(b, []string{"trials", "min", "p50", "p99", "max"},
		[][]string{{fmt.Sprint(len(inv.Trials)), Dur(inv.Min), Dur(inv.P50), Dur(inv.P99), Dur(inv.Max)}})
	var rows [][]string
	for i, t := range inv.Trials {
		rows = append(rows, []string{fmt.Sprint(i + 1), t.Variant, Dur(t.Elapsed), Dur(t.Post), fmt.Sprint(t.Polls), fmt.Sprint(t.Allowed), fmt.Sprint(t.HandlerDrift)})
	}
	fmt.Fprintf(b, "\n<details><summary>Every trial</summary>\n\n")
	table(b, []string{"trial", "redeployed to", "to the denial", "of which the POST", "calls", "allowed", "refused by billing (handler_drift)"}, rows)
	fmt.Fprintf(b, "\n</details>\n")
}

func missedSection(b *strings.Builder, r *Results) {
	fmt.Fprintf(b, "## Notes on missed targets\n\n")
	missed := 0
	// A profile shared by several targets is shown under the first.
	shownUnder := map[*Profile]string{}
	for _, t := range r.Targets {
		if t.Status != Missed {
			continue
		}
		missed++
		fmt.Fprintf(b, "### %s: %s\n\n", t.Name, t.Measured)
		switch first, shown := shownUnder[t.Profile]; {
		case t.Profile == nil:
			fmt.Fprintf(b, "No profile was captured for this target.\n\n")
		case shown:
			fmt.Fprintf(b, "The profile is the one under \"%s\" above.\n\n", first)
		default:
			shownUnder[t.Profile] = t.Name
			fmt.Fprintf(b, "%s\n\n```\n$ %s\n%s\n```\n\n", t.Profile.What, t.Profile.Command, strings.TrimRight(t.Profile.Top, "\n"))
		}
	}
	if missed == 0 {
		fmt.Fprintf(b, "None: every target that ran was met.\n")
	}
}

// levers is issue 17's levers as they were tried, each measured by the
// Go benchmark named against the code before it, when it was made:
// history, kept as the markdown it is shown as.
//
//go:embed levers.md
var levers string

func leversSection(b *strings.Builder, _ *Results) { b.WriteString(levers) }

// takingTurns says how the servers or modes of a step took their turns,
// each of them turns times.
func takingTurns(turns int) string {
	return fmt.Sprintf("turns, %d each: A B C … C B A, %d times over", turns, turns/2)
}

func methodSection(b *strings.Builder, r *Results) {
	m := r.Method
	fmt.Fprintf(b, "## Method\n\n")
	for _, line := range []string{
		fmt.Sprintf("**Check over gRPC.** The load (`bench/cmd/checkload`, package `bench/grpcload`), at concurrency %s on one connection, sends one CheckRequest as Envoy builds it under `envoy/demo.yaml`: the body packed as bytes, the route's `server_id`, the principal in `attributes.source.principal` (as with mTLS), and the `x-capsnap-epoch` of a snapshot capsnap minted at `tools/list`, after the `lookup_order` that refund's sequence rule wants. The body, the same bytes for every server: `%s`.", ints(m.Concurrencies), m.RequestBody),
		fmt.Sprintf("At each concurrency every server gets one Check from Go that must be allowed, then a discarded warm-up of %d requests; then the servers take %s (in the order capsnap, floor, OPA-Envoy, capsnap + envelope, capsnap + envelope under a grant), each turn 1/%d of a run sized from that server's warm-up rate to take about %v in all, so that a machine getting busier or quieter weighs on all of them alike (the two envelope capsnaps are those of [Signed envelope](#signed-envelope-issue-16)). The load counts requests and the harness kills a run past its deadline (a failure); it fails too on any error, denial or status other than OK.", m.GRPCWarmup, takingTurns(m.Turns), m.Turns, m.GRPCRun),
		"No denial is ever measured by accident: any gRPC error or non-OK status fails the benchmark; capsnap's own `capsnap_decisions_total` must count exactly the run's requests as allowed and none denied; the floor and OPA-Envoy (deterministic on one request) must allow it before and after. Both capsnap and OPA-Envoy must also deny a refund over the cap and a call under an unknown epoch, so that neither passes for doing nothing.",
		"Server CPU time is utime + stime from `/proc/PID/stat` over the measured turns, divided by their requests; it is good to a clock tick (10 ms) per turn, a few percent at worst here. Memory is VmRSS and VmHWM from `/proc/PID/status` after the last turn.",
		"capsnap runs `examples/demo/policy.yaml` with billing as its one live MCP server, snapshots for 30 minutes, and its audit trail written to a file (a line per decision, as in production). OPA-Envoy runs `bench/opa/policy.rego` on `bench/opa/data.json` (its own copy of the live digests, the snapshot's pins and the policy) with decision logs off, and does less than capsnap: no JSON Schema validation of the arguments, no sequence rule, no audit line. The comparison favours OPA.",
		fmt.Sprintf("**Through Envoy.** Three %s processes (`--concurrency 1`), configured from `envoy/demo.yaml`: without the ext_authz filter, with it pointed at the floor, and with it pointed at capsnap (header principal, as in the demo). billing runs without its handler-start pin check, as only capsnap sends pins. For each, %d workers hold their own MCP 2025-06-18 session on their own connection (initialize, tools/list, one `lookup_order`) and warm up for %v; then the modes take %s, each turn %v or %d calls per worker, whichever comes first. Any answer but HTTP 200 with a successful result fails the benchmark.", r.Machine.Envoy, m.EnvoyWorkers, m.EnvoyWarmup, takingTurns(m.Turns), m.EnvoyRun/time.Duration(m.Turns), m.EnvoyPerWorker/m.Turns),
		fmt.Sprintf("**tools/list through the response path.** `testbed/cmd/mcpfixture` serves %d generated tools as JSON (not SSE); a policy generated from its list classifies every one and grants one principal %d, spread over the list. Two capsnaps run that policy with the development header principal, one with `discovery.bind: delivered` (the default) and one with `bind: catalog`; two Envoys run `envoy/demo.yaml`, the second without its `capsnap.ext_proc` filter and otherwise the same. The harness posts raw stateless MCP 2026-07-28 `tools/list` requests (`MCP-Protocol-Version` and `Mcp-Method` headers) from %d workers on their own kept-alive connections, and times each from sending it to reading its whole body. Every listing must be HTTP 200 with an `x-capsnap-epoch` header and exactly the expected tool names, and neither capsnap's `capsnap_decisions_total` may count a denial during the turns, or the benchmark fails.", r.Delivery.CatalogTools, r.Delivery.GrantedTools, r.Delivery.Workers),
		"**Scale and hot path.** `go test -run '^$' -bench ... -benchmem`: the scale benchmarks are `BenchmarkCheckCatalogSize` and `BenchmarkSnapshotsLive` in `decide`; the hot path is every other benchmark of every package that has one, but the shared store's (below). A benchmark that does not exist is reported as not run.",
		fmt.Sprintf("**Invalidation.** `testbed.StartStack`: the real Envoy, capsnap and billing under the demo configuration, %d trials alternating billing between its `description_edit` and `baseline` variants, so that every trial is a real change of refund's definition. The resolution is one call's round trip through Envoy.", m.Trials),
		storeMethod(r),
		fmt.Sprintf("**Profiles.** For a missed gRPC target the notes show CPU profiles of the running capsnap and floor, taken from their net/http/pprof (capsnap's `debug.pprof: true`) for %v each while the load drives them alone (concurrency 1, for the target judged there) and at the highest concurrency (for the others), after the measured runs. For the response path's target they show the running capsnap's, taken the same way while the workers list through it after the measured turns. For any other missed target the harness profiles the Go benchmark closest to it (`-cpuprofile`, or `-memprofile` for memory). Each is shown as `go tool pprof -top`.", m.ProfileWindow),
		"**CPU by process.** Through Envoy and on the response path, every process that serves the calls (Envoy, the MCP server, the ext_authz server or capsnap, Redis, and the harness's own process, whose clients make the calls) has its utime + stime read from `/proc/PID/stat` before and after each measured turn; a mode's sum over its turns, divided by its calls, is what a call costs each.",
	} {
		fmt.Fprintf(b, "- %s\n", line)
	}
	fmt.Fprintf(b, "\nRerun: `make bench`. It installs Envoy and OPA-Envoy when they are missing, builds everything, and rewrites this file and `docs/benchmarks-latency.svg`.\n")
}

// signedDur is Dur of a difference, which may be negative.
func signedDur(d time.Duration) string {
	if d < 0 {
		return "−" + Dur(-d)
	}
	return Dur(d)
}

func table(b *strings.Builder, head []string, rows [][]string) {
	fmt.Fprintf(b, "| %s |\n", strings.Join(head, " | "))
	seps := make([]string, len(head))
	for i := range seps {
		seps[i] = "---"
	}
	fmt.Fprintf(b, "|%s|\n", strings.Join(seps, "|"))
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = strings.ReplaceAll(c, "|", `\|`)
		}
		fmt.Fprintf(b, "| %s |\n", strings.Join(cells, " | "))
	}
}

func errorCount(g GRPCRun) int {
	n := 0
	for _, v := range g.Errors {
		n += v
	}
	return n
}

func nsop(r gobench.Result) string { return Dur(time.Duration(r.Metrics["ns/op"])) }

func metric(r gobench.Result, unit string) string {
	v, ok := r.Metrics[unit]
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%.0f", v)
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func signed(d time.Duration) string {
	if d < 0 {
		return "−" + Dur(-d)
	}
	return "+" + Dur(d)
}

// thousands is n with a comma every three digits.
func thousands(n int) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "−" + s
	}
	return s
}

func ints(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}
