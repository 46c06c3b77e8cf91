package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// scalePattern selects the scale benchmarks (decide/bench_test.go);
// the hot-path run skips them.
const scalePattern = "^(BenchmarkCheckCatalogSize|BenchmarkSnapshotsLive)$"

// scale runs the catalog-size and live-snapshot benchmarks. Either may
// not exist yet: then its targets are reported as not run.
func (h *harness) scale(ctx context.Context) error {
	res, err := h.goBench("scale", scalePattern, "", "./decide").Do(ctx)
	h.results.Scale = res
	h.logf("   %d scale results", len(res))
	return err
}

// hotPath runs every other Go benchmark of the module, but the shared
// store's (storeBenchmarks): whatever exists.
func (h *harness) hotPath(ctx context.Context) error {
	pkgs, err := benchmarkPackages(ctx)
	if err != nil {
		return err
	}
	if len(pkgs) == 0 {
		h.logf("   no package has a benchmark")
		return nil
	}
	res, err := h.goBench("hot-path", ".", scalePattern+"|"+storePattern, pkgs...).Do(ctx)
	h.results.HotPath = res
	h.logf("   %d results from %s", len(res), strings.Join(pkgs, " "))
	return err
}

// benchmarkPackages are the module's packages with a Benchmark function
// in a test file, the harness's own excepted.
func benchmarkPackages(ctx context.Context) ([]string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-f", "{{.Dir}}", "./...").Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	root, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	var pkgs []string
	for _, dir := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			return nil, err
		}
		has, err := hasBenchmark(dir)
		if err != nil {
			return nil, err
		}
		if has && rel != "bench" && !strings.HasPrefix(rel, "bench/") {
			pkgs = append(pkgs, "./"+rel)
		}
	}
	return pkgs, nil
}

// hasBenchmark is whether a test file in dir has a Benchmark function.
func hasBenchmark(dir string) (bool, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || bytes.HasPrefix(b, []byte("func Benchmark")) || bytes.Contains(b, []byte("\nfunc Benchmark")) {
			return err == nil, err
		}
	}
	return false, err
}
