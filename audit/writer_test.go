package audit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is an underlying writer that keeps each write it is given.
type recorder struct {
	mu     sync.Mutex
	writes []string
	// gate, if set, holds the first write until it is closed; entered is
	// closed when that write begins.
	gate, entered chan struct{}
	fail          error
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	first := len(r.writes) == 0
	r.writes = append(r.writes, string(p))
	fail := r.fail
	r.mu.Unlock()
	if first && r.gate != nil {
		close(r.entered)
		<-r.gate
	}
	if fail != nil {
		return 0, fail
	}
	return len(p), nil
}

func (r *recorder) all() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.writes, "")
}

// Writes that arrive while a write is under way go out together in the
// next write, each whole, and each returns only once that write is done.
func TestWritesArrivingDuringAWriteShareTheNext(t *testing.T) {
	rec := &recorder{gate: make(chan struct{}), entered: make(chan struct{})}
	g := NewWriter(rec)
	var wg sync.WaitGroup
	wg.Go(func() { mustWrite(t, g, "first\n") })
	<-rec.entered
	const n = 32
	returned := make(chan string, n)
	for i := range n {
		wg.Go(func() {
			line := fmt.Sprintf("line %02d\n", i)
			mustWrite(t, g, line)
			returned <- line
		})
	}
	// Every Write has queued behind the held first write.
	for {
		g.mu.Lock()
		queued := bytes.Count(g.next.buf, []byte("\n"))
		g.mu.Unlock()
		if queued == n {
			break
		}
		runtime.Gosched()
	}
	if len(returned) != 0 {
		t.Fatal("a Write returned before its bytes were written")
	}
	close(rec.gate)
	wg.Wait()
	if len(rec.writes) != 2 {
		t.Fatalf("%d writes, want 2 (the first, then the %d queued together): %q", len(rec.writes), n, rec.writes)
	}
	got := strings.SplitAfter(rec.writes[1], "\n")
	got = got[:len(got)-1]
	want := make([]string, n)
	for i := range n {
		want[i] = fmt.Sprintf("line %02d\n", i)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("the second write held %q, want every queued line once, whole", got)
	}
}

// The Write that starts a batch yields, and yields again while other
// Writes join it, up to maxYields times: a burst shares one write, and a
// Write alone yields once.
func TestStartingWriteYieldsWhileWritesJoin(t *testing.T) {
	for _, tc := range []struct {
		name    string
		joining int // Writes that join during the first yields, one a yield
		yields  int
	}{
		{"alone", 0, 1},
		{"one joins", 1, 2},
		{"two join", 2, 3},
		{"a burst past the bound", maxYields + 2, maxYields},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			g := NewWriter(rec)
			var wg sync.WaitGroup
			yields := 0
			g.yield = func() {
				yields++
				if yields > tc.joining {
					return
				}
				// Another decision reaches its Write while this one yields.
				line := fmt.Sprintf("joined %d\n", yields)
				wg.Go(func() { mustWrite(t, g, line) })
				for {
					g.mu.Lock()
					joined := bytes.Contains(g.next.buf, []byte(line))
					g.mu.Unlock()
					if joined {
						return
					}
					runtime.Gosched()
				}
			}
			mustWrite(t, g, "first\n")
			wg.Wait()
			if yields != tc.yields {
				t.Errorf("yielded %d times, want %d", yields, tc.yields)
			}
			joined := min(tc.joining, maxYields)
			if got := strings.Count(rec.writes[0], "\n"); got != 1+joined {
				t.Errorf("the first write held %d lines, want %d: %q", got, 1+joined, rec.writes)
			}
			if got := strings.Count(rec.all(), "\n"); got != 1+joined {
				t.Errorf("%d lines written in all, want %d", got, 1+joined)
			}
		})
	}
}

// Under concurrent load every line is written exactly once, whole, each
// writer's lines in its own order, and is there when its Write returns.
func TestConcurrentWritesKeepEveryLine(t *testing.T) {
	rec := &recorder{}
	g := NewWriter(rec)
	const writers, lines = 8, 300
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range lines {
				line := fmt.Sprintf("w%d %04d\n", w, i)
				mustWrite(t, g, line)
				if i%50 == 0 && !strings.Contains(rec.all(), line) {
					t.Errorf("%q returned before it was written", line)
				}
			}
		})
	}
	wg.Wait()
	next := make([]int, writers)
	out := strings.SplitAfter(rec.all(), "\n")
	for _, line := range out[:len(out)-1] {
		var w, i int
		if _, err := fmt.Sscanf(line, "w%d %04d\n", &w, &i); err != nil || w >= writers {
			t.Fatalf("line %q is not one that was written", line)
		}
		if i != next[w] {
			t.Fatalf("writer %d: line %d came where %d was due", w, i, next[w])
		}
		next[w]++
	}
	for w, n := range next {
		if n != lines {
			t.Errorf("writer %d: %d lines written, want %d", w, n, lines)
		}
	}
}

// A failed write fails every Write it carried, and the next write is
// tried afresh.
func TestWriteErrorReachesItsWriters(t *testing.T) {
	full := errors.New("no space left on device")
	rec := &recorder{fail: full}
	g := NewWriter(rec)
	if _, err := g.Write([]byte("lost\n")); !errors.Is(err, full) {
		t.Fatalf("Write = %v, want the underlying error", err)
	}
	rec.mu.Lock()
	rec.fail = nil
	rec.mu.Unlock()
	if n, err := g.Write([]byte("kept\n")); err != nil || n != 5 {
		t.Fatalf("Write after the failure = %d, %v; want 5, nil", n, err)
	}
	if got := rec.writes[len(rec.writes)-1]; got != "kept\n" {
		t.Errorf("last write %q, want only the new line", got)
	}
}

func mustWrite(t *testing.T, w *Writer, s string) {
	t.Helper()
	if n, err := w.Write([]byte(s)); err != nil || n != len(s) {
		t.Errorf("Write(%q) = %d, %v", s, n, err)
	}
}

// BenchmarkWrite is an audit line from many goroutines to a file: with
// group commit (Writer), with a write per line (the *os.File alone), and
// chained with group commit (Trail, signing a checkpoint every second);
// the _call cases write an allowed tools/call's whole line (benchLine),
// where the chain hashes more. chained less group is what the chain costs
// a line under group commit. It reports the write system calls per line.
func BenchmarkWrite(b *testing.B) {
	line := []byte(`{"level":"info","log":"audit","decision":"allow","reason":"ok","principal":"spiffe://acme/agent/support-refund","server_id":"billing","tool":"refund"}` + "\n")
	signer, _ := testKey(b, 1, "k1")
	for _, tc := range []struct {
		name string
		line []byte
	}{{"group", line}, {"direct", line}, {"chained", line}, {"group_call", benchLine}, {"chained_call", benchLine}} {
		b.Run(tc.name, func(b *testing.B) {
			f, err := os.Create(filepath.Join(b.TempDir(), "audit.log"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			c := &counter{w: f}
			var w io.Writer = c
			switch {
			case strings.HasPrefix(tc.name, "group"):
				w = NewWriter(c)
			case strings.HasPrefix(tc.name, "chained"):
				tr := NewTrail(c, TrailOptions{Signer: signer, Interval: time.Second})
				defer tr.Close()
				w = tr
			}
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := w.Write(tc.line); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(c.writes.Load())/float64(b.N), "writes/line")
		})
	}
}

// counter counts the writes that reach w.
type counter struct {
	w      *os.File
	writes atomic.Int64
}

func (c *counter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.w.Write(p)
}
