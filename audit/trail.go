package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"hash"
	"io"
	"sync"
	"time"
)

// DefaultCheckpointInterval is how often a Trail signs a checkpoint of its
// chain when lines were added, unless told otherwise.
const DefaultCheckpointInterval = 10 * time.Second

// CheckpointType is the "typ" of a checkpoint's JWS header. The envelope
// keys sign checkpoints too; the type keeps a checkpoint from passing for
// an envelope, and an envelope for a checkpoint.
const CheckpointType = "capsnap-checkpoint+jwt"

// Signer signs a checkpoint: it returns a compact JWS (EdDSA, with the
// key's kid and the header typ CheckpointType) over payload.
type Signer interface {
	Sign(payload []byte) (compactJWS string, err error)
}

// SignerFunc is a function as a Signer.
type SignerFunc func(payload []byte) (string, error)

// Sign implements Signer.
func (f SignerFunc) Sign(payload []byte) (string, error) { return f(payload) }

// TrailOptions configure a Trail.
type TrailOptions struct {
	// Signer signs the checkpoints. Without one they are written unsigned,
	// and Verify reports them so.
	Signer Signer
	// Interval bounds how long a line waits for a checkpoint that covers
	// it; 0 is DefaultCheckpointInterval.
	Interval time.Duration
	// Resume is where the chain already in the file ends (see Resume); the
	// zero Link starts a new chain.
	Resume Link
	// Now is the clock checkpoints are stamped with; nil is time.Now.
	Now func() time.Time
}

// Trail is the audit trail: a group-committing Writer (see Writer) whose
// lines are chained by hash, one to the one before it, and whose chain is
// signed in checkpoint lines, at most Interval after a line is written and
// on Close.
//
// Each Write must be whole lines, each a JSON object ending in a newline
// (a zerolog logger writes one such line per event). The chain is cheap on
// the hot path: a Write hashes its own line up to where the chain members
// go, in its own goroutine, in parallel with the others, and holds the
// lock only to copy its bytes, as with a plain Writer; the goroutine that
// writes the batch adds each line's members (the only part that depends
// on the line before) and finishes its hash with them, in order.
type Trail struct {
	g        *Writer
	signer   Signer
	interval time.Duration
	now      func() time.Time

	// Owned by the goroutine writing a batch; batches are written one at
	// a time, so they need no lock of their own.
	head  Link   // the last line written
	since uint64 // lines since the last checkpoint
	out   []byte // the bytes of the batch being written

	stop, stopped chan struct{}
	closeOnce     sync.Once
	closeErr      error
}

// NewTrail returns a Trail on w, and starts its checkpoint timer. Nothing
// else may write to w. Close it to write the shutdown checkpoint.
func NewTrail(w io.Writer, o TrailOptions) *Trail {
	t := &Trail{signer: o.Signer, interval: o.Interval, now: o.Now, head: o.Resume,
		stop: make(chan struct{}), stopped: make(chan struct{})}
	if t.interval <= 0 {
		t.interval = DefaultCheckpointInterval
	}
	if t.now == nil {
		t.now = time.Now
	}
	t.g = NewWriter(w)
	t.g.seal = t.seal
	go t.tick()
	return t
}

// ErrNotLine is what a Write returns for bytes that are not whole lines,
// each a JSON object.
var ErrNotLine = errors.New("audit: a trail takes whole lines, each a JSON object")

// Write implements io.Writer: it returns once p's lines, chained, have
// been written.
func (t *Trail) Write(p []byte) (int, error) {
	if !objectLines(p) {
		return 0, ErrNotLine
	}
	if len(p) == 0 {
		return 0, nil
	}
	var one [1]hash.Hash
	ds := one[:0]
	for rest := p; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		d := digests.Get().(hash.Hash)
		d.Reset()
		body := rest[:i-1]
		d.Write(body)
		if !emptyObject(body) {
			d.Write(comma)
		}
		ds = append(ds, d)
		rest = rest[i+1:]
	}
	if err := t.g.write(p, func(b *batch) { b.digests = append(b.digests, ds...) }); err != nil {
		return 0, err
	}
	return len(p), nil
}

// digests are SHA-256 hashes for lines to begin.
var digests = sync.Pool{New: func() any { return sha256.New() }}

var comma = []byte{','}

// objectLines says whether p is whole lines, each "{...}".
func objectLines(p []byte) bool {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 2 || p[0] != '{' || p[i-1] != '}' {
			return false
		}
		p = p[i+1:]
	}
	return true
}

// Checkpoint writes a signed checkpoint now, if lines were written since
// the last one, and returns once it is written.
func (t *Trail) Checkpoint() error {
	return t.g.write(nil, func(b *batch) { b.checkpoint = true })
}

// Close stops the timer and writes the shutdown checkpoint (marked final,
// and written even if no line came since the last checkpoint). Writes
// after Close fail with ErrClosed. It does not close the underlying writer.
func (t *Trail) Close() error {
	t.closeOnce.Do(func() {
		close(t.stop)
		<-t.stopped
		t.closeErr = t.g.write(nil, func(b *batch) {
			b.checkpoint, b.final = true, true
			t.g.closed = true
		})
	})
	return t.closeErr
}

func (t *Trail) tick() {
	defer close(t.stopped)
	tk := time.NewTicker(t.interval)
	defer tk.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tk.C:
			_ = t.Checkpoint() // a failed write is the failed Writes' to report
		}
	}
}

// seal chains the batch's lines and, when asked, ends it with a
// checkpoint. It runs in the Writer's flush, outside its lock.
func (t *Trail) seal(b *batch) []byte {
	out := t.out[:0]
	for n, p := 0, b.buf; len(p) > 0; n++ {
		i := bytes.IndexByte(p, '\n')
		out = t.link(out, p[:i], b.digests[n])
		digests.Put(b.digests[n])
		t.since++
		p = p[i+1:]
	}
	if b.final || b.checkpoint && t.since > 0 {
		out = t.link(out, t.checkpoint(b.final), nil)
		t.since = 0
	}
	if cap(out) <= maxRetained {
		t.out = out
	}
	return out
}

// link appends obj, chained after the head, and a newline to out. d, if
// set, has hashed obj up to where the chain members go; link finishes it.
func (t *Trail) link(out, obj []byte, d hash.Hash) []byte {
	start := len(out)
	out = appendLinked(out, obj, t.head)
	line := out[start:]
	if d == nil {
		t.head = t.head.next(line)
	} else {
		d.Write(line[linkPrefix(obj):])
		t.head.Seq++
		d.Sum(t.head.Hash[:0])
	}
	return append(out, '\n')
}

// checkpointPayload is what a checkpoint's JWS signs. The checkpoint line
// carries the same members, readable, and the JWS.
type checkpointPayload struct {
	// Seq and Head are the chain_seq and hash of the last line the
	// checkpoint covers: the line before it.
	Seq  uint64 `json:"seq"`
	Head string `json:"head"`
	// Lines is how many lines came since the previous checkpoint.
	Lines uint64 `json:"lines"`
	Time  string `json:"time"`
	// IntervalMS is the trail's checkpoint interval: the next checkpoint
	// follows within it if more lines come.
	IntervalMS int64 `json:"interval_ms"`
	// Final marks the shutdown checkpoint: capsnap wrote nothing after it.
	Final bool `json:"final"`
}

// checkpointLine is a checkpoint as a trail line (without its chain
// members).
type checkpointLine struct {
	Log string `json:"log"`
	checkpointPayload
	JWS       string `json:"jws,omitempty"`
	SignError string `json:"sign_error,omitempty"`
}

// CheckpointLog is a checkpoint line's "log". Not "audit": every line
// whose "log" is "audit" is a decision, as the trail's readers take it.
const CheckpointLog = "audit_checkpoint"

// checkpointPrefix is how every checkpoint line begins.
const checkpointPrefix = `{"log":"` + CheckpointLog + `",`

func (t *Trail) checkpoint(final bool) []byte {
	c := checkpointLine{Log: CheckpointLog, checkpointPayload: checkpointPayload{
		Seq: t.head.Seq, Head: hashText(t.head.Hash), Lines: t.since,
		Time: t.now().UTC().Format(time.RFC3339Nano), IntervalMS: t.interval.Milliseconds(), Final: final,
	}}
	if t.signer != nil {
		payload, err := json.Marshal(c.checkpointPayload)
		if err == nil {
			c.JWS, err = t.signer.Sign(payload)
		}
		if err != nil {
			// Written anyway, unsigned, with why: the lines it covers are
			// the next checkpoint's to sign.
			c.JWS, c.SignError = "", err.Error()
		}
	}
	line, err := json.Marshal(c)
	if err != nil {
		panic("audit: marshal a checkpoint: " + err.Error()) // strings and numbers: cannot happen
	}
	return line
}
