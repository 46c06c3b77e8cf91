// Package audit writes capsnap's audit trail: one line per decision,
// durable in the sense that matters to an auditor. A line is handed to the
// file before its decision is answered, so no answered decision is missing
// from the trail, and the lines of decisions made at the same time are
// coalesced into one write (group commit), so that the trail costs one
// system call per burst rather than one per decision.
package audit

import (
	"io"
	"sync"
)

// Writer is an io.Writer that group-commits: each Write returns once its
// bytes have been written to the underlying writer, in one write together
// with whatever other Writes arrived while the previous write was under
// way. No goroutine runs in the background and nothing waits for company:
// a Write that finds no write under way writes at once, as a plain writer
// would.
//
// Each Write's bytes are written whole and in the order the Writes took
// the lock, never interleaved with another's; a zerolog logger writes one
// event per Write, so each audit line stays intact.
type Writer struct {
	w io.Writer

	mu   sync.Mutex
	done *sync.Cond
	// next is the batch new Writes join; writing says a write of the one
	// before it is under way.
	next    *batch
	writing bool
	// spare is the buffer of the last batch written, kept for the next.
	spare []byte
}

// batch is the Writes that go to the underlying writer in one write, and
// that write's outcome, which each of them returns.
type batch struct {
	buf     []byte
	written bool
	err     error
}

// NewWriter returns a Writer on w. Nothing else may write to w.
func NewWriter(w io.Writer) *Writer {
	g := &Writer{w: w, next: &batch{}}
	g.done = sync.NewCond(&g.mu)
	return g
}

// maxRetained bounds the buffer a Writer keeps between bursts.
const maxRetained = 1 << 20

// Write implements io.Writer. It fails with the underlying writer's error
// if the write carrying p failed.
func (g *Writer) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.next
	b.buf = append(b.buf, p...)
	for !b.written {
		if g.writing {
			g.done.Wait()
			continue
		}
		// No write is under way, so b is still the next batch: write it.
		g.flush()
	}
	if b.err != nil {
		return 0, b.err
	}
	return len(p), nil
}

// flush writes the next batch. It is called with g.mu held, and releases
// it during the write so that more Writes can join the batch after.
func (g *Writer) flush() {
	b := g.next
	g.next, g.spare = &batch{buf: g.spare[:0]}, nil
	g.writing = true
	g.mu.Unlock()
	_, err := g.w.Write(b.buf)
	g.mu.Lock()
	g.writing = false
	b.written, b.err = true, err
	if cap(b.buf) <= maxRetained {
		g.spare = b.buf
	}
	b.buf = nil
	g.done.Broadcast()
}
