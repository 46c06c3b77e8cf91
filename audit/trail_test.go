package audit

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// testKey is an Ed25519 key made from a fixed seed, its signer (as the
// envelope keys sign checkpoints: EdDSA, kid, typ CheckpointType) and the
// JWKS that holds its public half.
func testKey(t testing.TB, seed byte, kid string) (Signer, jose.JSONWebKeySet) {
	t.Helper()
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, ed25519.SeedSize))
	return jwsSigner(t, priv, kid, CheckpointType), jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
		{Key: priv.Public(), KeyID: kid, Algorithm: string(jose.EdDSA), Use: "sig"},
	}}
}

func jwsSigner(t testing.TB, priv ed25519.PrivateKey, kid, typ string) Signer {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: priv},
		(&jose.SignerOptions{}).WithType(jose.ContentType(typ)).WithHeader("kid", kid))
	if err != nil {
		t.Fatal(err)
	}
	return SignerFunc(func(payload []byte) (string, error) {
		jws, err := s.Sign(payload)
		if err != nil {
			return "", err
		}
		return jws.CompactSerialize()
	})
}

// syncBuffer is a bytes.Buffer safe to read while a Trail writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// decisionLine is an audit line as zerolog writes it.
func decisionLine(i int) string {
	return fmt.Sprintf(`{"time":"2026-03-01T12:00:00Z","log":"audit","decision":"allow","reason":"ok","request_id":"r-%d","principal":"spiffe://acme/agent/support-refund","server_id":"billing","tool":"refund","message":"decision"}`+"\n", i)
}

func verifyString(t *testing.T, keys jose.JSONWebKeySet, trail string) *Report {
	t.Helper()
	rep, err := Verify(VerifyOptions{Keys: keys}, Input{Name: "audit.log", R: strings.NewReader(trail)})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// checkpoints are the checkpoint lines of a trail, decoded.
func checkpoints(t *testing.T, trail string) []checkpointLine {
	t.Helper()
	var out []checkpointLine
	for line := range strings.Lines(trail) {
		if strings.HasPrefix(line, checkpointPrefix) {
			var c checkpointLine
			if err := json.Unmarshal([]byte(line), &c); err != nil {
				t.Fatalf("checkpoint %q: %v", line, err)
			}
			out = append(out, c)
		}
	}
	return out
}

// Concurrent writers under group commit, with checkpoints falling among
// their batches, leave one valid chain holding every line once, each
// writer's in its own order.
func TestConcurrentWritersKeepAValidChain(t *testing.T) {
	signer, keys := testKey(t, 1, "k1")
	out := &syncBuffer{}
	tr := NewTrail(out, TrailOptions{Signer: signer, Interval: time.Millisecond})
	const writers, lines = 8, 300
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range lines {
				line := fmt.Sprintf(`{"w":%d,"i":%d}`+"\n", w, i)
				if n, err := tr.Write([]byte(line)); err != nil || n != len(line) {
					t.Errorf("Write = %d, %v", n, err)
				}
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			if err := tr.Checkpoint(); err != nil {
				t.Errorf("Checkpoint: %v", err)
			}
		}
	})
	wg.Wait()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	rep := verifyString(t, keys, out.String())
	if rep.Problem != nil {
		t.Fatalf("a trail written concurrently does not verify: %v", rep.Problem)
	}
	cps := checkpoints(t, out.String())
	if rep.Lines != writers*lines+len(cps) || !rep.Final || rep.Checkpoints != len(cps) || len(cps) < 2 {
		t.Errorf("report %+v for %d lines and %d checkpoints", rep, writers*lines, len(cps))
	}
	next := make([]int, writers)
	var covered uint64
	for line := range strings.Lines(out.String()) {
		if strings.HasPrefix(line, checkpointPrefix) {
			continue
		}
		covered++
		var l struct{ W, I int }
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		if l.I != next[l.W] {
			t.Fatalf("writer %d: line %d came where %d was due", l.W, l.I, next[l.W])
		}
		next[l.W]++
	}
	var counted uint64
	for _, c := range cps {
		counted += c.Lines
	}
	if counted != covered {
		t.Errorf("the checkpoints count %d lines, the trail holds %d", counted, covered)
	}
}

// A checkpoint follows within the interval once lines were written, none
// while no line comes, and a final one on Close; Writes after Close fail.
func TestCheckpointAfterIntervalAndOnClose(t *testing.T) {
	signer, keys := testKey(t, 1, "k1")
	out := &syncBuffer{}
	tr := NewTrail(out, TrailOptions{Signer: signer, Interval: 20 * time.Millisecond})
	for i := range 3 {
		if _, err := tr.Write([]byte(decisionLine(i))); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(checkpoints(t, out.String())) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no checkpoint 5s after lines were written, with a 20ms interval")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // five idle intervals
	cps := checkpoints(t, out.String())
	if len(cps) != 1 {
		t.Fatalf("%d checkpoints after one burst and idle intervals, want 1: %+v", len(cps), cps)
	}
	if c := cps[0]; c.Seq != 3 || c.Lines != 3 || c.Final || c.IntervalMS != 20 || c.JWS == "" {
		t.Errorf("interval checkpoint %+v, want seq 3, 3 lines, not final, signed", c)
	}
	if rep := verifyString(t, keys, out.String()); rep.Problem == nil || rep.Problem.Kind != KindTruncated {
		t.Errorf("before Close: %+v, want truncated (no shutdown checkpoint yet)", rep.Problem)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	cps = checkpoints(t, out.String())
	if len(cps) != 2 || !cps[1].Final || cps[1].Lines != 0 || cps[1].Seq != 4 {
		t.Fatalf("after Close: %+v, want a final checkpoint of seq 4 (the first checkpoint), 0 lines", cps)
	}
	if rep := verifyString(t, keys, out.String()); rep.Problem != nil || !rep.Final || rep.Checkpoints != 2 {
		t.Errorf("after Close: %+v, %v", rep, rep.Problem)
	}
	if _, err := tr.Write([]byte(decisionLine(9))); !errors.Is(err, ErrClosed) {
		t.Errorf("Write after Close = %v, want ErrClosed", err)
	}
	if err := tr.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if n := len(checkpoints(t, out.String())); n != 2 {
		t.Errorf("%d checkpoints after a second Close, want 2", n)
	}
}

// A Trail takes only whole lines, each a JSON object.
func TestTrailRefusesWhatIsNotALine(t *testing.T) {
	tr := NewTrail(&syncBuffer{}, TrailOptions{})
	defer tr.Close()
	for _, p := range []string{"{}", "{\"a\":1}", "not json\n", "{\"a\":1}\n{\"b\"\n", "\n", "[1]\n"} {
		if _, err := tr.Write([]byte(p)); !errors.Is(err, ErrNotLine) {
			t.Errorf("Write(%q) = %v, want ErrNotLine", p, err)
		}
	}
	if n, err := tr.Write([]byte("{}\n{ }\n")); err != nil || n != 7 {
		t.Errorf("Write of empty objects = %d, %v", n, err)
	}
}

// A capsnap that restarts on the same file continues its chain; a line
// torn by a crash is ended and left outside the chain, where Verify
// finds it.
func TestResume(t *testing.T) {
	signer, keys := testKey(t, 1, "k1")
	path := filepath.Join(t.TempDir(), "audit.log")
	run := func(lines int) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		from, err := Resume(f)
		if err != nil {
			t.Fatal(err)
		}
		tr := NewTrail(f, TrailOptions{Signer: signer, Resume: from})
		for i := range lines {
			if _, err := tr.Write([]byte(decisionLine(i))); err != nil {
				t.Fatal(err)
			}
		}
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
	verifyFile := func() *Report {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return verifyString(t, keys, string(data))
	}
	run(3)
	run(0)
	run(2)
	rep := verifyFile()
	if rep.Problem != nil || rep.Chains != 1 || rep.LastSeq != 8 || rep.Checkpoints != 3 {
		t.Fatalf("three runs on one file: %+v, %v; want one chain of 8 lines, 3 checkpoints", rep, rep.Problem)
	}

	// A crash tears the last line.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"time":"2026-03-01T12:00:00Z","log":"au`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if rep := verifyFile(); rep.Problem == nil || rep.Problem.Kind != KindTruncated || rep.Problem.Line != 9 {
		t.Errorf("torn last line: %v, want truncated at line 9", rep.Problem)
	}
	run(1)
	rep = verifyFile()
	if rep.Problem == nil || rep.Problem.Kind != KindInserted || rep.Problem.Line != 9 {
		t.Fatalf("torn line inside the trail: %v, want inserted at line 9", rep.Problem)
	}
	// The torn line was never in the chain: without it, the chain holds.
	data, _ := os.ReadFile(path)
	lines := strings.SplitAfter(string(data), "\n")
	whole := strings.Join(append(lines[:8:8], lines[9:]...), "")
	if rep := verifyString(t, keys, whole); rep.Problem != nil || rep.LastSeq != 10 {
		t.Errorf("the trail without its torn line: %+v, %v", rep, rep.Problem)
	}

	// Lines written before the trail was chained start a new chain.
	old := filepath.Join(t.TempDir(), "old.log")
	if err := os.WriteFile(old, []byte(`{"log":"audit","decision":"allow"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err = os.OpenFile(old, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if from, err := Resume(f); err != nil || from != (Link{}) {
		t.Errorf("Resume after an unchained line = %+v, %v; want a new chain", from, err)
	}
}

// A fixed clock and a fixed key make a trail byte for byte the same.
func TestTrailIsDeterministic(t *testing.T) {
	write := func() string {
		signer, _ := testKey(t, 1, "k1")
		out := &syncBuffer{}
		tr := NewTrail(out, TrailOptions{Signer: signer, Now: fixedClock})
		for i := range 3 {
			if _, err := tr.Write([]byte(decisionLine(i))); err != nil {
				t.Fatal(err)
			}
		}
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	a, b := write(), write()
	if a != b {
		t.Errorf("two trails of the same lines differ:\n%s\n%s", a, b)
	}
	first, _, _ := strings.Cut(a, "\n")
	want := strings.TrimSuffix(decisionLine(0), "}\n") + `,"chain_seq":1,"chain_prev":"sha256:` + strings.Repeat("0", 64) + `"}`
	if first != want {
		t.Errorf("first line\n%s\nwant\n%s", first, want)
	}
}

func fixedClock() time.Time { return time.Date(2026, 3, 1, 12, 0, 1, 0, time.UTC) }

// A batch whose write failed leaves a gap in the chain, which Verify
// reports: lines its Writes were told were lost are not passed off as
// never written.
func TestFailedWriteLeavesAGap(t *testing.T) {
	signer, keys := testKey(t, 1, "k1")
	rec := &recorder{}
	tr := NewTrail(rec, TrailOptions{Signer: signer})
	mustWriteLine := func(i int) {
		t.Helper()
		if _, err := tr.Write([]byte(decisionLine(i))); err != nil {
			t.Fatal(err)
		}
	}
	mustWriteLine(0)
	full := errors.New("no space left on device")
	rec.mu.Lock()
	rec.fail = full
	rec.mu.Unlock()
	if _, err := tr.Write([]byte(decisionLine(1))); !errors.Is(err, full) {
		t.Fatalf("Write = %v, want the underlying error", err)
	}
	rec.mu.Lock()
	rec.fail = nil
	rec.mu.Unlock()
	mustWriteLine(2)
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	var kept []string
	for i, w := range rec.writes {
		if i != 1 {
			kept = append(kept, w)
		}
	}
	rep := verifyString(t, keys, strings.Join(kept, ""))
	if p := rep.Problem; p == nil || p.Kind != KindRemoved || p.Line != 2 || p.Seq != 3 {
		t.Errorf("problem %v, want removed at line 2 (seq 3): the lost line's seq 2 is missing", p)
	}
}
