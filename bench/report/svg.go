package report

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

var colors = map[string]color.Color{
	Capsnap: color.RGBA{0x1f, 0x77, 0xb4, 0xff}, Floor: color.RGBA{0x7f, 0x7f, 0x7f, 0xff}, OPA: color.RGBA{0xd6, 0x27, 0x28, 0xff},
	ModeNone: color.RGBA{0xc7, 0xc7, 0xc7, 0xff}, ModeFloor: color.RGBA{0x7f, 0x7f, 0x7f, 0xff}, ModeCapsnap: color.RGBA{0x1f, 0x77, 0xb4, 0xff},
}

// SVG renders the latency chart with gonum.org/v1/plot: for every server
// at every concurrency over gRPC, and every mode through Envoy, a stroke
// from p50 (filled) to p99 (open), on a logarithmic axis so that
// microseconds and milliseconds both read.
func SVG(r *Results) ([]byte, error) {
	p := plot.New()
	p.Title.Text = "Latency per request: p50 (filled) to p99 (open), log scale"
	p.X.Label.Text = fmt.Sprintf("make bench, %s: Check over gRPC (checkload) and MCP tools/call through Envoy", r.Machine.Date)
	p.Y.Scale = plot.LogScale{}
	p.Add(&plotter.Grid{Horizontal: plotter.DefaultGridLineStyle})
	type run struct {
		label    string
		p50, p99 time.Duration
	}
	var captions []string
	var groups [][]run
	for _, c := range r.Method.Concurrencies {
		var g []run
		for _, s := range Servers {
			if x, ok := r.Run(s, c); ok {
				g = append(g, run{s, x.P50, x.P99})
			}
		}
		captions, groups = append(captions, fmt.Sprintf("gRPC Check, concurrency %d", c)), append(groups, g)
	}
	var g []run
	for _, m := range Modes {
		if e, ok := r.Mode(m); ok {
			g = append(g, run{m, e.P50, e.P99})
		}
	}
	captions, groups = append(captions, fmt.Sprintf("through Envoy, %d sessions", r.Method.EnvoyWorkers)), append(groups, g)
	p.NominalX(captions...)
	p.X.Min, p.X.Max = -0.5, float64(len(captions))-0.5

	lo, hi := math.Inf(1), 0.0
	legend := map[color.Color]bool{}
	for i, g := range groups {
		for j, x := range g {
			at := float64(i) + 0.25*(float64(j)-float64(len(g)-1)/2)
			us := []float64{max(float64(x.p50)/1e3, 1e-3), max(float64(x.p99)/1e3, 1e-3)}
			lo, hi = min(lo, us[0], us[1]), max(hi, us[0], us[1])
			xys := plotter.XYs{{X: at, Y: us[0]}, {X: at, Y: us[1]}}
			line, points, err := plotter.NewLinePoints(xys)
			if err != nil {
				return nil, err
			}
			c := colors[x.label]
			line.Color, line.Width = c, vg.Points(2)
			points.GlyphStyleFunc = func(k int) draw.GlyphStyle {
				shape := []draw.GlyphDrawer{draw.CircleGlyph{}, draw.RingGlyph{}}[k]
				return draw.GlyphStyle{Color: c, Radius: vg.Points(4), Shape: shape}
			}
			labels, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: []string{short(x.p50), short(x.p99)}})
			if err != nil {
				return nil, err
			}
			for k := range labels.TextStyle {
				labels.TextStyle[k].Font.Size = vg.Points(7)
			}
			labels.Offset = vg.Point{X: vg.Points(6), Y: vg.Points(-3)}
			p.Add(line, points, labels)
			if !legend[c] {
				legend[c] = true
				p.Legend.Add(x.label, line, points)
			}
		}
	}
	if hi == 0 {
		lo, hi = 1, 10
	}
	// Whole decades around every value.
	p.Y.Min, p.Y.Max = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	p.Y.Tick.Marker = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		var ticks []plot.Tick
		for v := lo; v <= hi*1.0001; v *= 10 {
			ticks = append(ticks, plot.Tick{Value: v, Label: axisLabel(v)})
		}
		return ticks
	})
	p.Legend.Top, p.Legend.Left, p.Legend.XOffs = true, true, vg.Points(12)
	w, err := p.WriterTo(14*vg.Inch, 6*vg.Inch, "svg")
	if err != nil {
		return nil, fmt.Errorf("latency chart: %w", err)
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		return nil, fmt.Errorf("latency chart: %w", err)
	}
	return b.Bytes(), nil
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

// short is a point's value label: as Dur, without the space.
func short(d time.Duration) string { return strings.ReplaceAll(Dur(d), " ", "") }
