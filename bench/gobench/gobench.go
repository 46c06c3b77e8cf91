// Package gobench runs Go benchmarks with go test and reads their results
// in the standard benchmark format (one "BenchmarkName-P N value unit ..."
// line per result, after "pkg:" configuration lines).
package gobench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// Result is one benchmark's line.
type Result struct {
	Pkg  string `json:"pkg"`
	Name string `json:"name"`
	// Procs is GOMAXPROCS, from the name's "-P" suffix (0 if none).
	Procs int   `json:"procs"`
	N     int64 `json:"iterations"`
	// Metrics are the values by unit: ns/op, B/op, allocs/op and any
	// custom ones (B/snapshot).
	Metrics map[string]float64 `json:"metrics"`
}

// Parse reads every result line in r; other lines are ignored.
func Parse(r io.Reader) ([]Result, error) {
	var out []Result
	pkg := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		if res, ok := parseLine(line); ok {
			res.Pkg = pkg
			out = append(out, res)
		}
	}
	return out, sc.Err()
}

// parseLine reads "BenchmarkX-2  1000  123 ns/op  4 B/op"; ok is false
// for anything else (logs, PASS, a benchmark's name printed before its
// figures when it logs).
func parseLine(line string) (Result, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || len(f)%2 != 0 || !strings.HasPrefix(f[0], "Benchmark") {
		return Result{}, false
	}
	n, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return Result{}, false
	}
	res := Result{Name: f[0], N: n, Metrics: map[string]float64{}}
	if i := strings.LastIndexByte(f[0], '-'); i > 0 {
		if p, err := strconv.Atoi(f[0][i+1:]); err == nil {
			res.Name, res.Procs = f[0][:i], p
		}
	}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return Result{}, false
		}
		res.Metrics[f[i+1]] = v
	}
	return res, true
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
	// Dir is the module's root; Log receives go test's whole output.
	Dir, Log string
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
	cmd.Dir = r.Dir
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
