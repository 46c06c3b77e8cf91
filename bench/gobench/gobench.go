// Package gobench runs Go benchmarks with go test and reads their results
// with golang.org/x/perf/benchfmt, the reader of benchstat.
package gobench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/perf/benchfmt"
)

// Result is one benchmark's line.
type Result struct {
	Pkg string `json:"pkg"`
	// Name is the benchmark's full name without its -GOMAXPROCS suffix.
	Name string `json:"name"`
	N    int    `json:"iterations"`
	// Metrics are the values by unit as go test printed them: ns/op,
	// B/op, allocs/op and any custom ones (B/snapshot).
	Metrics map[string]float64 `json:"metrics"`
}

// Parse reads every result in r; lines that are not one are passed over.
func Parse(r io.Reader) ([]Result, error) {
	var out []Result
	br := benchfmt.NewReader(r, "go test")
	for br.Scan() {
		res, ok := br.Result().(*benchfmt.Result)
		if !ok {
			continue
		}
		name := res.Name.String()
		if _, parts := res.Name.Parts(); len(parts) > 0 && parts[len(parts)-1][0] == '-' {
			name = name[:len(name)-len(parts[len(parts)-1])]
		}
		metrics := map[string]float64{}
		for _, v := range res.Values {
			// benchfmt tidies ns/op into sec/op; the report reads go
			// test's own units.
			if v.OrigUnit != "" {
				v.Value, v.Unit = v.OrigValue, v.OrigUnit
			}
			metrics[v.Unit] = v.Value
		}
		out = append(out, Result{Pkg: res.GetConfig("pkg"), Name: "Benchmark" + name, N: res.Iters, Metrics: metrics})
	}
	return out, br.Err()
}

// Find is the result named name (without its -P suffix), if any.
func Find(rs []Result, name string) (Result, bool) {
	for _, r := range rs {
		if r.Name == name {
			return r, true
		}
	}
	return Result{}, false
}

// Run is one go test invocation that runs benchmarks only.
type Run struct {
	// Log receives go test's whole output.
	Log string
	// Bench and Skip are go test's -bench and -skip patterns.
	Bench, Skip string
	// Args are further go test flags (-benchtime, -cpuprofile, ...).
	Args []string
	Pkgs []string
}

// Do runs r. A benchmark that fails, or a package that does not build,
// is an error; a pattern that matches no benchmark is not (the result is
// then empty).
func (r Run) Do(ctx context.Context) ([]Result, error) {
	args := r.args()
	cmd := exec.CommandContext(ctx, "go", args...)
	// go test runs the test binary as its child: its own process group,
	// killed whole on cancel, leaves no benchmark running behind us.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if werr := os.WriteFile(r.Log, out.Bytes(), 0o644); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return nil, fmt.Errorf("go %s: %w (output in %s):\n%s", strings.Join(args, " "), err, r.Log, tail(out.Bytes(), 30))
	}
	return Parse(&out)
}

func (r Run) args() []string {
	args := []string{"test", "-run", "^$", "-bench", r.Bench, "-benchmem"}
	if r.Skip != "" {
		args = append(args, "-skip", r.Skip)
	}
	return append(append(args, r.Args...), r.Pkgs...)
}

// String is r as a shell command, quoted where it needs to be.
func (r Run) String() string {
	args := r.args()
	for i, a := range args {
		if strings.ContainsAny(a, "^$|*()[]?' ") {
			args[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return "go " + strings.Join(args, " ")
}

// tail is the last n lines of b.
func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
