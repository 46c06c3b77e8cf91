package report

import (
	"bytes"
	_ "embed"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/template"
	"time"

	"github.com/capsnap/capsnap/bench/gobench"
	"github.com/capsnap/capsnap/bench/proc"
)

// benchmarks is BENCHMARKS.md with its figures left to fill in: the prose
// is there, and this package only computes what it shows.
//
//go:embed benchmarks.md.tmpl
var benchmarks string

// levers is issue 17's levers as they were tried, each measured by the
// Go benchmark named against the code before it, when it was made:
// history, kept as the markdown it is shown as.
//
//go:embed levers.md
var levers string

var page = template.Must(template.New("BENCHMARKS.md").Funcs(template.FuncMap{
	"dur": Dur, "signed": signed, "thousands": thousands, "orDash": orDash, "nsop": nsop, "metric": metric, "ratio": ratio, "mib": mib,
	"turns": takingTurns, "ints": ints, "rows": rows, "cpuBreakdown": cpuBreakdown, "deliveryTarget": DeliveryTarget,
	"redisSnapshots": func() int { return RedisSnapshots },
	"catalogSizes":   func() []int { return CatalogSizes },
	"snapshotCounts": func() []int { return SnapshotCounts },
	// find is the result named name, or nil.
	"find": func(results []gobench.Result, name string) *gobench.Result {
		if r, ok := gobench.Find(results, name); ok {
			return &r
		}
		return nil
	},
	"levers": func() string { return levers },
	"gib":    func(perSnapshot float64) string { return fmt.Sprintf("%.2f", perSnapshot*1e6/(1<<30)) },
	"round":  func(d time.Duration) time.Duration { return d.Round(time.Second) },
	"sub":    func(a, b time.Duration) time.Duration { return a - b },
	"per":    func(d time.Duration, n int) time.Duration { return d / time.Duration(n) },
	"div":    func(a, b int) int { return a / b },
	"inc":    func(i int) int { return i + 1 },
	"trim":   func(s string) string { return strings.TrimRight(s, "\n") },
	"pkg":    func(path string) string { return strings.TrimPrefix(path, "github.com/capsnap/capsnap/") },
	"errors": func(byError map[string]int) int {
		n := 0
		for _, v := range byError {
			n += v
		}
		return n
	},
	// others are a benchmark's metrics besides time and memory.
	"others": func(r gobench.Result) string {
		var other []string
		for unit, v := range r.Metrics {
			if unit != "ns/op" && unit != "B/op" && unit != "allocs/op" {
				other = append(other, fmt.Sprintf("%g %s", v, unit))
			}
		}
		sort.Strings(other)
		return strings.Join(other, ", ")
	},
}).Parse(benchmarks))

// Markdown renders BENCHMARKS.md.
func Markdown(r *Results) ([]byte, error) {
	var b bytes.Buffer
	if err := page.Execute(&b, view{r}); err != nil {
		return nil, fmt.Errorf("BENCHMARKS.md: %w", err)
	}
	return b.Bytes(), nil
}

// view is what the template reads: the results, and what it shows of them
// that takes computing.
type view struct{ *Results }

// table is a markdown table; one without a head is its rows alone.
type table struct {
	head []string
	rows [][]string
}

func (t table) String() string {
	var b strings.Builder
	line := func(cells []string) {
		for i, c := range cells {
			cells[i] = strings.ReplaceAll(c, "|", `\|`)
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | "))
	}
	if t.head != nil {
		line(t.head)
		b.WriteString("|" + strings.Repeat("---|", len(t.head)) + "\n")
	}
	for _, r := range t.rows {
		line(slices.Clone(r))
	}
	return b.String()
}

// rows are a table's rows, under a head the template writes.
func rows(r [][]string) string { return table{rows: r}.String() }

// RunAt is the gRPC run of server at concurrency c, or a zero one.
func (v view) RunAt(server string, c int) GRPCRun {
	g, _ := v.Run(server, c)
	return g
}

// cpuBreakdown is a live profile's parts, capsnap's against the floor's,
// and all of them.
func cpuBreakdown(live LiveProfile) [][]string {
	var out [][]string
	var sumC, sumF time.Duration
	for _, p := range live.CPUBreakdown {
		out = append(out, []string{p.Part, Dur(p.Capsnap), Dur(p.Floor), signedDur(p.Capsnap - p.Floor)})
		sumC, sumF = sumC+p.Capsnap, sumF+p.Floor
	}
	return append(out, []string{"all", Dur(sumC), Dur(sumF), signedDur(sumC - sumF)})
}

// NoExtAuthz is the run through Envoy without ext_authz, which the
// others add latency to.
func (v view) NoExtAuthz() EnvoyRun {
	e, _ := v.Mode(ModeNone)
	return e
}

// floors is capsnap through Envoy against each floor.
type floors struct {
	Table table
	// Whole is capsnap's calls/s against the ext_authz floor's, split
	// into Transport, the ext_authz + ext_proc floor's against the
	// ext_authz floor's, and Own, capsnap's against the ext_authz +
	// ext_proc floor's: Whole = Transport × Own. Transport and Own are
	// empty without the second floor.
	Whole, Transport, Own string
}

// Floors is nil unless capsnap and the ext_authz floor ran through Envoy.
func (v view) Floors() *floors {
	c, ok1 := v.Mode(ModeCapsnap)
	f, ok2 := v.Mode(ModeFloor)
	if !ok1 || !ok2 || f.RPS == 0 {
		return nil
	}
	// capsnap's ratio to each floor with the digits that decide its
	// target, as the target gives it.
	vs := func(fl EnvoyRun, limit float64) string { return ratioText(c.RPS/fl.RPS, limit) + "×" }
	out := &floors{Whole: vs(f, MinEnvoyRatio)}
	for _, fl := range []struct {
		mode  string
		limit float64
	}{{ModeFloor, MinEnvoyRatio}, {ModeFloorExtProc, MinEnvoyExtProcRatio}} {
		run, ok := v.Mode(fl.mode)
		if !ok || run.RPS == 0 {
			out.Table.rows = append(out.Table.rows, []string{fl.mode, "not run", "", "", "", "", ""})
			continue
		}
		out.Table.rows = append(out.Table.rows, []string{fl.mode, fmt.Sprintf("%.0f", run.RPS), Dur(run.P50), Dur(run.P99),
			vs(run, fl.limit), signed(c.P50 - run.P50), signed(c.P99 - run.P99)})
		if fl.mode == ModeFloorExtProc {
			out.Transport, out.Own = ratioOf(run.RPS, f.RPS), vs(run, fl.limit)
		}
	}
	return out
}

// EnvoyCPU is a call's CPU by process in each mode, what capsnap adds over
// each floor and what ext_proc's transport adds to the floor; nil if no
// mode has the figures.
func (v view) EnvoyCPU() *table {
	var cpu []cpuRow
	for _, e := range v.Envoy {
		if len(e.CPU) > 0 {
			cpu = append(cpu, cpuRow{e.Mode, e.CPU})
		}
	}
	if len(cpu) == 0 {
		return nil
	}
	return cpuTable(cpu, cpuDiff{ModeCapsnap, ModeFloor, "capsnap − floor"},
		cpuDiff{ModeFloorExtProc, ModeFloor, "ext_proc floor − floor"},
		cpuDiff{ModeCapsnap, ModeFloorExtProc, "capsnap − ext_proc floor"})
}

// cpuRow is one mode's split of a call's CPU among processes.
type cpuRow struct {
	mode string
	cpu  []ProcessCPU
}

// cpuDiff is a row, named label, of what mode more adds over mode base.
type cpuDiff struct{ more, base, label string }

// cpuTable is each row's CPU per call, by process and in all, and then
// each of diffs whose two modes both have a row.
func cpuTable(rows []cpuRow, diffs ...cpuDiff) *table {
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
	t := &table{head: append(append([]string{"mode"}, procs...), "all")}
	byMode := map[string]cpuRow{}
	for _, r := range rows {
		line, all := []string{r.mode}, time.Duration(0)
		for _, p := range procs {
			d := perCall(r, p)
			all += d
			line = append(line, orDash(d))
		}
		t.rows = append(t.rows, append(line, Dur(all)))
		byMode[r.mode] = r
	}
	for _, d := range diffs {
		m, ok1 := byMode[d.more]
		b, ok2 := byMode[d.base]
		if !ok1 || !ok2 {
			continue
		}
		line, all := []string{d.label}, time.Duration(0)
		for _, p := range procs {
			x := perCall(m, p) - perCall(b, p)
			all += x
			line = append(line, signed(x))
		}
		t.rows = append(t.rows, append(line, signed(all)))
	}
	return t
}

// saving is what the response path saves an agent on one listing.
type saving struct {
	Percent, Fewer float64
	Bytes          int
}

// Saving is nil unless both listings' sizes were measured.
func (d Delivery) Saving() *saving {
	if d.FilteredBytes <= 0 || d.UnfilteredBytes <= 0 {
		return nil
	}
	return &saving{100 * float64(d.FilteredBytes) / float64(d.UnfilteredBytes), float64(d.UnfilteredBytes) / float64(d.FilteredBytes), d.UnfilteredBytes - d.FilteredBytes}
}

// CPU is a listing's CPU by process with and without the response path;
// nil without both.
func (d Delivery) CPU() *table {
	if len(d.WithCPU) == 0 || len(d.WithoutCPU) == 0 {
		return nil
	}
	const with, without = "with the response path", "without the response path"
	return cpuTable([]cpuRow{{without, d.WithoutCPU}, {with, d.WithCPU}}, cpuDiff{with, without, "added by the response path"})
}

// missed is a missed target, and the target under which its profile is
// already shown, if another's.
type missed struct {
	Target
	ShownUnder string
}

// Missed are the missed targets; a profile shared by several is shown
// under the first.
func (v view) Missed() []missed {
	var out []missed
	shownUnder := map[*Profile]string{}
	for _, t := range v.Targets {
		if t.Status != Missed {
			continue
		}
		m := missed{Target: t}
		if t.Profile != nil {
			m.ShownUnder = shownUnder[t.Profile]
			if m.ShownUnder == "" {
				shownUnder[t.Profile] = t.Name
			}
		}
		out = append(out, m)
	}
	return out
}

// takingTurns says how the servers or modes of a step took their turns,
// each of them turns times.
func takingTurns(turns int) string {
	return fmt.Sprintf("turns, %d each: A B C … C B A, %d times over", turns, turns/2)
}

// orDash is d, or – if nothing was measured.
func orDash(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return Dur(d)
}

// signedDur is Dur of a difference, which may be negative.
func signedDur(d time.Duration) string {
	if d < 0 {
		return "−" + Dur(-d)
	}
	return Dur(d)
}

func signed(d time.Duration) string {
	if d < 0 {
		return "−" + Dur(-d)
	}
	return "+" + Dur(d)
}

// ratioOf is a ÷ b as "1.23×", or "–" if b is zero.
func ratioOf(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func nsop(r gobench.Result) string { return Dur(time.Duration(r.Metrics["ns/op"])) }

func metric(r gobench.Result, unit string) string {
	v, ok := r.Metrics[unit]
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%.0f", v)
}

// mib is a process's resident memory now (at its peak).
func mib(m proc.Memory) string {
	return fmt.Sprintf("%.1f MiB (%.1f MiB)", float64(m.RSS)/(1<<20), float64(m.Peak)/(1<<20))
}

// ratio is ratioOf a and b, figures (float64) or durations.
func ratio(a, b any) string {
	f := func(x any) float64 {
		if d, ok := x.(time.Duration); ok {
			return float64(d)
		}
		return x.(float64)
	}
	return ratioOf(f(a), f(b))
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
