package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/capsnap/capsnap/bench/gobench"
)

// scalePattern selects the scale benchmarks (decide/bench_test.go);
// the hot-path run skips them.
const scalePattern = "^(BenchmarkCheckCatalogSize|BenchmarkSnapshotsLive)$"

// scale runs the catalog-size and live-snapshot benchmarks. Either may
// not exist yet: then its targets are reported as not run.
func (h *harness) scale(ctx context.Context) error {
	res, err := gobench.Run{
		Dir: ".", Log: filepath.Join(h.logs, "go-bench-scale.log"),
		Bench: scalePattern, Args: []string{"-timeout", "20m"}, Pkgs: []string{"./decide"},
	}.Do(ctx)
	if err != nil {
		return err
	}
	h.results.Scale = res
	h.logf("   %d scale results", len(res))
	return nil
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
	res, err := gobench.Run{
		Dir: ".", Log: filepath.Join(h.logs, "go-bench-hot-path.log"),
		Bench: ".", Skip: scalePattern + "|" + storePattern, Args: []string{"-timeout", "20m"}, Pkgs: pkgs,
	}.Do(ctx)
	if err != nil {
		return err
	}
	h.results.HotPath = res
	h.logf("   %d results from %s", len(res), strings.Join(pkgs, " "))
	return nil
}

// benchmarkPackages are the module's packages with a Benchmark function
// in a test file, the harness's own excepted.
func benchmarkPackages(ctx context.Context) ([]string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-f", "{{.ImportPath}} {{.Dir}}", "./...").Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	var pkgs []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, dir, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(path, "github.com/capsnap/capsnap/bench") {
			continue
		}
		has, err := hasBenchmark(dir)
		if err != nil {
			return nil, err
		}
		if has {
			pkgs = append(pkgs, "./"+strings.TrimPrefix(strings.TrimPrefix(path, "github.com/capsnap/capsnap"), "/"))
		}
	}
	return pkgs, nil
}

func hasBenchmark(dir string) (bool, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return false, err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return false, err
		}
		if bytes.HasPrefix(b, []byte("func Benchmark")) || bytes.Contains(b, []byte("\nfunc Benchmark")) {
			return true, nil
		}
	}
	return false, nil
}
