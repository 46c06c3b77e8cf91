// Package audit writes capsnap's audit trail: one line per decision,
// durable in the sense that matters to an auditor. A line is handed to the
// file before its decision is answered, so no answered decision is missing
// from the trail, and the lines of decisions made at the same time are
// coalesced into one write (group commit), so that the trail costs one
// system call per burst rather than one per decision.
//
// A Trail (trail.go) is the Writer capsnap serves with: it chains each line
// to the one before it by hash and signs checkpoints of the chain, and
// Verify (verify.go) checks a trail file against the signing keys.
package audit

import (
	"errors"
	"hash"
	"io"
	"runtime"
	"sync"
)

// ErrClosed is what a Write returns after its Trail was closed.
var ErrClosed = errors.New("audit: trail closed")

// Writer is an io.Writer that group-commits: each Write returns once its
// bytes have been written to the underlying writer, in one write together
// with whatever other Writes arrived while the previous write was under
// way, or while the Write that starts a batch yielded the processor
// (runtime.Gosched) to the goroutines ready to run, which under load are
// other decisions on their way to their own Writes: once, and again while
// Writes joined, up to maxYields times. No goroutine runs in the
// background and nothing waits on a timer: alone, a Write writes at once,
// as a plain writer would.
//
// Each Write's bytes are written whole and in the order the Writes took
// the lock, never interleaved with another's; a zerolog logger writes one
// event per Write, so each audit line stays intact.
type Writer struct {
	w io.Writer
	// seal, if set, makes the bytes a batch writes from the bytes its
	// Writes gave: a Trail's chain. It runs in the goroutine writing the
	// batch, outside mu, one batch at a time and in order.
	seal func(*batch) []byte

	mu   sync.Mutex
	done *sync.Cond
	// next is the batch new Writes join; writing says a write of the one
	// before it is under way.
	next    *batch
	writing bool
	// spare is the buffer of the last batch written, kept for the next,
	// and spareDigests its digests.
	spare        []byte
	spareDigests []hash.Hash
	// closed refuses every Write after a Trail's shutdown checkpoint.
	closed bool
	// yield is runtime.Gosched; a test sets its own.
	yield func()
}

// batch is the Writes that go to the underlying writer in one write, and
// that write's outcome, which each of them returns.
type batch struct {
	buf []byte
	// digests are a Trail's hashes of buf's lines, one a line, begun by
	// their Writes and finished by seal.
	digests []hash.Hash
	// checkpoint asks seal to end the batch with a checkpoint, and final
	// with the shutdown checkpoint.
	checkpoint, final bool
	// gathering says the Write that started the batch is letting others
	// join it.
	gathering bool
	written   bool
	err       error
}

// NewWriter returns a Writer on w. Nothing else may write to w.
func NewWriter(w io.Writer) *Writer {
	g := &Writer{w: w, next: &batch{}, yield: runtime.Gosched}
	g.done = sync.NewCond(&g.mu)
	return g
}

// maxRetained bounds the buffer a Writer keeps between bursts.
const maxRetained = 1 << 20

// maxYields bounds the times the Write that starts a batch yields: each
// lets more decisions join the write, and holds back the answer to its
// own.
const maxYields = 3

// Write implements io.Writer. It fails with the underlying writer's error
// if the write carrying p failed.
func (g *Writer) Write(p []byte) (int, error) {
	if err := g.write(p, nil); err != nil {
		return 0, err
	}
	return len(p), nil
}

// write adds p to the next batch, lets mark (if set) mark that batch under
// the lock, and returns once the batch is written, with its outcome.
func (g *Writer) write(p []byte, mark func(*batch)) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrClosed
	}
	b := g.next
	b.buf = append(b.buf, p...)
	if mark != nil {
		mark(b)
	}
	for !b.written {
		if g.writing || b.gathering {
			g.done.Wait()
			continue
		}
		// Let the goroutines ready to run reach their own Writes first,
		// so that they join b and wait for it: one system call a batch,
		// and the fewer batches, the less the trail costs. Alone, nothing
		// is ready and this returns at once. Only the Write that starts b
		// yields: the others wait while it gathers, and it writes b
		// straight after, with no unlock between.
		//
		// While Writes keep joining, more decisions are on their way: it
		// yields again, up to maxYields times in all, so that a burst of
		// them shares the write.
		b.gathering = true
		for range maxYields {
			n := len(b.buf)
			g.mu.Unlock()
			g.yield()
			g.mu.Lock()
			if len(b.buf) == n {
				break
			}
		}
		b.gathering = false
		// No write is under way, so b is still the next batch: write it.
		g.flush()
	}
	return b.err
}

// flush writes the next batch. It is called with g.mu held, and releases
// it during the write so that more Writes can join the batch after.
func (g *Writer) flush() {
	b := g.next
	g.next = &batch{buf: g.spare[:0], digests: g.spareDigests[:0]}
	g.spare, g.spareDigests = nil, nil
	g.writing = true
	g.mu.Unlock()
	out := b.buf
	if g.seal != nil {
		out = g.seal(b)
	}
	var err error
	if len(out) > 0 {
		_, err = g.w.Write(out)
	}
	g.mu.Lock()
	g.writing = false
	b.written, b.err = true, err
	if cap(b.buf) <= maxRetained {
		g.spare = b.buf
	}
	clear(b.digests)
	g.spareDigests = b.digests
	b.buf, b.digests = nil, nil
	g.done.Broadcast()
}
