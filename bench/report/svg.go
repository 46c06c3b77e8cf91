package report

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"
)

// bar is one pair of bars in the chart: p50 and p99 of one server or mode.
type bar struct {
	label    string
	color    string
	p50, p99 time.Duration
}

// group is a cluster of bars under one caption.
type group struct {
	caption string
	bars    []bar
}

var colors = map[string]string{
	Capsnap: "#1f77b4", Floor: "#7f7f7f", OPA: "#d62728",
	ModeNone: "#c7c7c7", ModeFloor: "#7f7f7f", ModeCapsnap: "#1f77b4",
}

// Chart geometry, in SVG user units.
const (
	chartW, chartH             = 1040, 460
	plotL, plotR, plotT, plotB = 70, 1020, 50, 370
	barW, pairGap, groupGap    = 24, 18, 40
)

// SVG renders the latency chart: p50 (solid) and p99 (pale) of every
// server at every concurrency over gRPC, and of every mode through Envoy,
// on a logarithmic axis so that microseconds and milliseconds both read.
func SVG(r *Results) []byte {
	groups := chartGroups(r)
	lo, hi := axisRange(groups)
	y := func(d time.Duration) float64 {
		v := math.Max(float64(d)/1e3, lo)
		return plotB - (math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*(plotB-plotT)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="15" font-weight="bold">Latency per request: p50 (solid) and p99 (pale), log scale</text>`+"\n", plotL)
	fmt.Fprintf(&b, `<text x="%d" y="40" fill="#555">make bench, %s: Check over gRPC (checkload) and MCP tools/call through Envoy</text>`+"\n", plotL, html.EscapeString(r.Machine.Date))
	axis(&b, lo, hi, y)
	x := float64(plotL + 20)
	for _, g := range groups {
		start := x
		for _, br := range g.bars {
			pair(&b, x, br, y)
			x += 2*barW + pairGap
		}
		mid := (start + x - pairGap) / 2
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" font-weight="bold">%s</text>`+"\n", mid, plotB+44, html.EscapeString(g.caption))
		x += groupGap
	}
	legend(&b, groups)
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// chartGroups are the bars to draw, in run order.
func chartGroups(r *Results) []group {
	var gs []group
	for _, c := range r.Method.Concurrencies {
		g := group{caption: fmt.Sprintf("gRPC Check, concurrency %d", c)}
		for _, s := range Servers {
			run, ok := r.Run(s, c)
			if ok {
				g.bars = append(g.bars, bar{s, colors[s], run.P50, run.P99})
			}
		}
		gs = append(gs, g)
	}
	g := group{caption: fmt.Sprintf("through Envoy, %d sessions", r.Method.EnvoyWorkers)}
	for _, m := range Modes {
		if e, ok := r.Mode(m); ok {
			g.bars = append(g.bars, bar{m, colors[m], e.P50, e.P99})
		}
	}
	return append(gs, g)
}

// axisRange is the axis's range in µs: whole decades around every value.
func axisRange(groups []group) (lo, hi float64) {
	lo, hi = math.Inf(1), 0
	for _, g := range groups {
		for _, br := range g.bars {
			for _, d := range []time.Duration{br.p50, br.p99} {
				if d > 0 {
					lo = math.Min(lo, float64(d)/1e3)
					hi = math.Max(hi, float64(d)/1e3)
				}
			}
		}
	}
	if hi == 0 {
		return 1, 10
	}
	lo = math.Pow(10, math.Floor(math.Log10(lo)))
	hi = math.Pow(10, math.Ceil(math.Log10(hi)))
	if hi <= lo {
		hi = lo * 10
	}
	return lo, hi
}

func axis(b *strings.Builder, lo, hi float64, y func(time.Duration) float64) {
	for v := lo; v <= hi*1.0001; v *= 10 {
		yy := y(time.Duration(v * 1e3))
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#dddddd"/>`+"\n", plotL, plotR, yy, yy)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", plotL-6, yy, axisLabel(v))
	}
	fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#333333"/>`+"\n", plotL, plotR, plotB, plotB)
	fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#333333"/>`+"\n", plotL, plotL, plotT, plotB)
}

func axisLabel(us float64) string {
	switch {
	case us >= 1e6:
		return fmt.Sprintf("%g s", us/1e6)
	case us >= 1e3:
		return fmt.Sprintf("%g ms", us/1e3)
	default:
		return fmt.Sprintf("%g µs", us)
	}
}

// pair draws br's p50 and p99 bars side by side from x, with their values
// above them and the server's name below.
func pair(b *strings.Builder, x float64, br bar, y func(time.Duration) float64) {
	for i, v := range []struct {
		d       time.Duration
		opacity float64
	}{{br.p50, 1}, {br.p99, 0.45}} {
		bx := x + float64(i*barW)
		top := y(v.d)
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%d" height="%.1f" fill="%s" fill-opacity="%.2f"><title>%s %s: %s</title></rect>`+"\n",
			bx, top, barW, plotB-top, br.color, v.opacity, html.EscapeString(br.label), []string{"p50", "p99"}[i], Dur(v.d))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="9">%s</text>`+"\n", bx+barW/2, top-3, html.EscapeString(short(v.d)))
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle" font-size="10">%s</text>`+"\n", x+barW, plotB+14, html.EscapeString(shortLabel(br.label)))
}

// short is a bar's value label: as Dur, without the space.
func short(d time.Duration) string { return strings.ReplaceAll(Dur(d), " ", "") }

// shortLabel fits a server or mode name under its pair of bars.
func shortLabel(s string) string {
	switch s {
	case Floor:
		return "floor"
	case ModeNone:
		return "no authz"
	case ModeFloor:
		return "→ floor"
	case ModeCapsnap:
		return "→ capsnap"
	}
	return s
}

// legend names each colour once: the through-Envoy modes share their
// colours with the servers they call.
func legend(b *strings.Builder, groups []group) {
	x := float64(plotL)
	seen := map[string]bool{}
	for _, g := range groups {
		for _, br := range g.bars {
			if seen[br.color] {
				continue
			}
			seen[br.color] = true
			fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="12" height="12" fill="%s"/>`+"\n", x, chartH-30, br.color)
			fmt.Fprintf(b, `<text x="%.1f" y="%d">%s</text>`+"\n", x+16, chartH-20, html.EscapeString(br.label))
			x += 26 + 7*float64(len([]rune(br.label)))
		}
	}
}
