package report

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/BENCHMARKS.md from testdata/results.json")

// The report of a whole make bench run's results.json is the one that run
// wrote, byte for byte: a change to the harness that changes BENCHMARKS.md
// shows here first.
func TestMarkdownGolden(t *testing.T) {
	got, err := Markdown(savedRun(t))
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile("testdata/BENCHMARKS.md", got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("BENCHMARKS.md of testdata/results.json differs from testdata/BENCHMARKS.md (go test -update to accept):\n%s", firstDiff(got, want))
	}
}

// The saved run's targets are what Evaluate makes of its figures.
func TestEvaluateGolden(t *testing.T) {
	r := savedRun(t)
	got := Evaluate(r)
	if len(got) != len(r.Targets) {
		t.Fatalf("%d targets, the run had %d", len(got), len(r.Targets))
	}
	for i, tg := range got {
		want := r.Targets[i]
		want.Profile = nil
		if tg != want {
			t.Errorf("got %+v\nwant %+v", tg, want)
		}
	}
}

// savedRun is testdata/results.json, a whole make bench run's.
func savedRun(t *testing.T) *Results {
	t.Helper()
	b, err := os.ReadFile("testdata/results.json")
	if err != nil {
		t.Fatal(err)
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// firstDiff is the first line where got and want differ.
func firstDiff(got, want []byte) string {
	g, w := bytes.Split(got, []byte("\n")), bytes.Split(want, []byte("\n"))
	for i := range max(len(g), len(w)) {
		var gl, wl []byte
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if !bytes.Equal(gl, wl) {
			return fmt.Sprintf("line %d\n got: %s\nwant: %s", i+1, gl, wl)
		}
	}
	return ""
}
