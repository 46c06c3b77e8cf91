package gobench

import (
	"os"
	"strings"
	"testing"
)

const output = `goos: linux
goarch: amd64
pkg: github.com/capsnap/capsnap/extauthz
cpu: Intel(R) Xeon(R) Processor
BenchmarkCheckAllowed-2                	  154321	      7712 ns/op	    2712 B/op	      31 allocs/op
BenchmarkCheckCatalogSize/tools=100000-2         	  100000	      8123 ns/op	    2800 B/op	      33 allocs/op
    bench_test.go:99: a log line between results
BenchmarkSnapshotsLive/snapshots=1000000-2       	  200000	      5123 ns/op	      1432 B/snapshot	    2100 B/op	      25 allocs/op
BenchmarkSlow
BenchmarkSlow-2   	       1	2000000000 ns/op
PASS
ok  	github.com/capsnap/capsnap/extauthz	12.345s
pkg: github.com/capsnap/capsnap/mcpparse
BenchmarkParse/small-2	 1000000	      1042 ns/op	     512 B/op	       3 allocs/op
PASS
`

func TestParse(t *testing.T) {
	rs, err := Parse(strings.NewReader(output))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 5 {
		t.Fatalf("got %d results: %+v", len(rs), rs)
	}
	live, ok := Find(rs, "BenchmarkSnapshotsLive/snapshots=1000000")
	if !ok || live.N != 200000 || live.Metrics["B/snapshot"] != 1432 || live.Metrics["ns/op"] != 5123 || live.Metrics["allocs/op"] != 25 {
		t.Fatalf("snapshots: %+v", live)
	}
	if live.Pkg != "github.com/capsnap/capsnap/extauthz" {
		t.Fatalf("pkg %q", live.Pkg)
	}
	p, ok := Find(rs, "BenchmarkParse/small")
	if !ok || p.Pkg != "github.com/capsnap/capsnap/mcpparse" {
		t.Fatalf("parse: %+v", p)
	}
	if _, ok := Find(rs, "BenchmarkCheckCatalogSize/tools=10"); ok {
		t.Fatal("found a benchmark that did not run")
	}
}

// A make bench run's own output, custom units and all, in go test's
// units: benchfmt would read ns/op as sec/op.
func TestParseStore(t *testing.T) {
	f, err := os.Open("testdata/store.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rs, err := Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 6 {
		t.Fatalf("got %d results: %+v", len(rs), rs)
	}
	other, _ := Find(rs, "BenchmarkCheckStore/redis_other_replica")
	redis, _ := Find(rs, "BenchmarkSnapshotsRedis/snapshots=10000")
	for _, c := range []struct {
		res  Result
		unit string
		want float64
	}{
		{other, "ns/op", 215106}, {other, "B/op", 8308}, {other, "allocs/op", 96},
		{redis, "pins/snapshot", 2}, {redis, "redis-B/snapshot", 1028}, {redis, "record-B", 619}, {redis, "ns/op", 4130},
	} {
		if got, ok := c.res.Metrics[c.unit]; !ok || got != c.want {
			t.Errorf("%s %s = %v, want %v", c.res.Name, c.unit, got, c.want)
		}
	}
	if other.N != 6410 || other.Pkg != "github.com/capsnap/capsnap/extauthz" {
		t.Errorf("%+v", other)
	}
}

func TestParseNothing(t *testing.T) {
	rs, err := Parse(strings.NewReader("PASS\nok  \tx\t0.01s\ntesting: warning: no tests to run\n"))
	if err != nil || len(rs) != 0 {
		t.Fatalf("got %v, %v", rs, err)
	}
}

func TestRunString(t *testing.T) {
	r := Run{Bench: "^BenchmarkCheckAllowed$", Args: []string{"-cpuprofile", "out/check.pprof"}, Pkgs: []string{"./extauthz"}}
	want := `go test -run '^$' -bench '^BenchmarkCheckAllowed$' -benchmem -cpuprofile out/check.pprof ./extauthz`
	if got := r.String(); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}
