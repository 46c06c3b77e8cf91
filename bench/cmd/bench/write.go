package main

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/capsnap/capsnap/bench/report"
)

// write writes results.json, BENCHMARKS.md and the latency chart.
func (h *harness) write(context.Context) error {
	h.results.Elapsed = time.Since(h.started)
	h.saveResults()
	if err := os.MkdirAll(filepath.Dir(h.o.svg), 0o755); err != nil {
		return err
	}
	svg, err := report.SVG(&h.results)
	if err != nil {
		return err
	}
	if err := os.WriteFile(h.o.svg, svg, 0o644); err != nil {
		return err
	}
	md, err := report.Markdown(&h.results, h.o.svg)
	if err != nil {
		return err
	}
	return os.WriteFile(h.o.report, md, 0o644)
}
