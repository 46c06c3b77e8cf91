package audit

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// sampleTrail is a closed trail of 12 decisions with a checkpoint after
// every 4, as lines (each with its newline):
//
//	1-4 decisions (seq 1-4)    5 checkpoint (seq 5)
//	6-9 decisions (seq 6-9)    10 checkpoint (seq 10)
//	11-14 decisions (seq 11-14) 15 shutdown checkpoint (seq 15)
func sampleTrail(t testing.TB, signer Signer) []string {
	t.Helper()
	tr := sampleWriting(t, signer, 12)
	if err := tr.t.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(tr.out.String(), "\n")
	return lines[:len(lines)-1]
}

type writing struct {
	t   *Trail
	out *syncBuffer
}

// sampleWriting is a trail of n decisions with a checkpoint after every
// 4, still open.
func sampleWriting(t testing.TB, signer Signer, n int) writing {
	t.Helper()
	out := &syncBuffer{}
	tr := NewTrail(out, TrailOptions{Signer: signer, Now: fixedClock, Interval: time.Hour})
	for i := range n {
		if _, err := tr.Write([]byte(decisionLine(i))); err != nil {
			t.Fatal(err)
		}
		if i%4 == 3 && i+1 < n {
			if err := tr.Checkpoint(); err != nil {
				t.Fatal(err)
			}
		}
	}
	return writing{tr, out}
}

// rechain recomputes every line's chain members, as someone who can write
// the file but not sign can.
func rechain(lines []string) []string {
	out := make([]string, len(lines))
	var head Link
	for i, l := range lines {
		obj := []byte(strings.TrimSuffix(l, "\n"))
		if _, _, ok := parseLink(obj); ok {
			obj = unlinked(obj)
		}
		line := appendLinked(nil, obj, head)
		head = head.next(line)
		out[i] = string(line) + "\n"
	}
	return out
}

// resign replaces the checkpoint at index i with one signed by signer,
// and rechains.
func resign(t *testing.T, lines []string, i int, signer Signer) []string {
	t.Helper()
	var c checkpointLine
	if err := json.Unmarshal([]byte(lines[i]), &c); err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(c.checkpointPayload)
	var err error
	if c.JWS, err = signer.Sign(payload); err != nil {
		t.Fatal(err)
	}
	line, _ := json.Marshal(c)
	out := append([]string(nil), lines...)
	out[i] = string(line) + "\n"
	return rechain(out)
}

func jwsOf(t *testing.T, line string) string {
	t.Helper()
	var c checkpointLine
	if err := json.Unmarshal([]byte(line), &c); err != nil || c.JWS == "" {
		t.Fatalf("%q is not a signed checkpoint: %v", line, err)
	}
	return c.JWS
}

// editJWS changes the three parts of line i's jws with change, leaving the
// rest of the line, its chain members included, as it was.
func editJWS(t *testing.T, lines []string, i int, change func(parts []string)) []string {
	t.Helper()
	jws := jwsOf(t, lines[i])
	parts := strings.Split(jws, ".")
	change(parts)
	out := append([]string(nil), lines...)
	out[i] = strings.Replace(out[i], jws, strings.Join(parts, "."), 1)
	return out
}

// flipPrev changes the first hex digit of line i's chain_prev.
func flipPrev(lines []string, i int) []string {
	out := append([]string(nil), lines...)
	j := strings.LastIndex(out[i], "sha256:") + len("sha256:")
	d := byte('0')
	if out[i][j] == '0' {
		d = '1'
	}
	out[i] = out[i][:j] + string(d) + out[i][j+1:]
	return out
}

func without(lines []string, i ...int) []string {
	var out []string
	for j, l := range lines {
		skip := false
		for _, k := range i {
			skip = skip || j == k
		}
		if !skip {
			out = append(out, l)
		}
	}
	return out
}

func with(lines []string, at int, extra string) []string {
	out := append([]string(nil), lines[:at]...)
	out = append(out, extra)
	return append(out, lines[at:]...)
}

func edit(lines []string, i int, old, new string) []string {
	out := append([]string(nil), lines...)
	out[i] = strings.Replace(out[i], old, new, 1)
	return out
}

// The first thing wrong, whatever was done to the trail, and where.
func TestVerifyFindsTampering(t *testing.T) {
	signer, keys := testKey(t, 1, "k1")
	trail := sampleTrail(t, signer)
	_, otherKeys := testKey(t, 2, "k2")
	intruder, _ := testKey(t, 3, "k1") // another key, claiming kid k1
	envelopeSigner := jwsSigner(t, ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, 32)), "k1", "capsnap-envelope+jwt")
	unsigned := sampleTrail(t, nil)
	swapped := append([]string(nil), trail...)
	swapped[6], swapped[7] = trail[7], trail[6]
	// The checkpoint at line 10: its signature's first byte changed; its
	// payload swapped for another checkpoint's; its jws not a JWS.
	badSig := editJWS(t, trail, 9, func(parts []string) {
		parts[2] = string(parts[2][0]^1) + parts[2][1:]
	})
	otherPayload := editJWS(t, trail, 9, func(parts []string) {
		parts[1] = strings.Split(jwsOf(t, trail[4]), ".")[1]
	})
	notJWS := editJWS(t, trail, 9, func(parts []string) { parts[0] = "e30" })

	tests := []struct {
		name  string
		lines []string
		keys  jose.JSONWebKeySet
		kind  Kind
		line  int    // 1-based; 0: no problem
		seq   uint64 // the problem's seq
	}{
		{"intact", trail, keys, "", 0, 0},
		{"line deleted", without(trail, 6), keys, KindRemoved, 7, 8},
		{"two lines deleted", without(trail, 6, 7), keys, KindRemoved, 7, 9},
		{"checkpoint deleted", without(trail, 4), keys, KindRemoved, 5, 6},
		{"first lines deleted", trail[2:], keys, KindRemoved, 1, 3},
		{"line edited", edit(trail, 6, `"decision":"allow"`, `"decision":"deny"`), keys, KindEdited, 7, 7},
		{"chain_prev edited", flipPrev(trail, 6), keys, KindEdited, 7, 7},
		{"line before a checkpoint edited", edit(trail, 8, `"decision":"allow"`, `"decision":"deny"`), keys, KindEdited, 9, 9},
		{"last decision edited", edit(trail, 13, `"decision":"allow"`, `"decision":"deny"`), keys, KindEdited, 14, 14},
		{"chain_prev edited to another length", edit(trail, 6, `"chain_prev":"sha256:`, `"chain_prev":"sha256:0`), keys, KindInserted, 7, 0},
		{"unchained line inserted", with(trail, 7, `{"log":"audit","decision":"allow"}`+"\n"), keys, KindInserted, 8, 0},
		{"line repeated", with(trail, 7, trail[6]), keys, KindInserted, 8, 7},
		{"pair reordered", swapped, keys, KindReordered, 7, 8},
		{"edited and rechained", rechain(edit(trail, 6, `"decision":"allow"`, `"decision":"deny"`)), keys, KindRewritten, 10, 10},
		{"line inserted and rechained", rechain(with(trail, 7, decisionLine(99))), keys, KindRewritten, 11, 11},
		{"tail cut", trail[:12], keys, KindTruncated, 12, 12},
		{"tail cut at a checkpoint", trail[:10], keys, KindTruncated, 10, 10},
		{"last line cut short", append(trail[:14:14], trail[14][:40]), keys, KindTruncated, 15, 0},
		{"newline cut", append(trail[:14:14], strings.TrimSuffix(trail[14], "\n")), keys, KindTruncated, 15, 0},
		{"shutdown checkpoint edited", edit(trail, 14, `"lines":4`, `"lines":3`), keys, KindEdited, 15, 15},
		{"signature forged", badSig, keys, KindForged, 10, 10},
		{"signed payload swapped", otherPayload, keys, KindForged, 10, 10},
		{"jws not a JWS", notJWS, keys, KindForged, 10, 10},
		{"signed by another key under a known kid", resign(t, trail, 9, intruder), keys, KindForged, 10, 10},
		{"signed by an unknown key", trail, otherKeys, KindUnknownKey, 5, 5},
		{"an envelope signature as a checkpoint's", resign(t, trail, 4, envelopeSigner), keys, KindForged, 5, 5},
		{"unsigned checkpoints", unsigned, keys, KindUnsigned, 5, 5},
		{"a new chain after a cut tail", append(trail[:12:12], trail...), keys, KindTruncated, 13, 1},
		{"two whole runs (stdout)", append(trail[:15:15], trail...), keys, "", 0, 0},
		{"empty", nil, keys, KindTruncated, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := verifyString(t, tt.keys, strings.Join(tt.lines, ""))
			p := rep.Problem
			t.Log(p)
			if tt.kind == "" {
				if p != nil {
					t.Fatalf("problem %v in an intact trail", p)
				}
				if !rep.Final || rep.Checkpoints == 0 || len(rep.KeyIDs) != 1 {
					t.Errorf("report %+v", rep)
				}
				return
			}
			if p == nil {
				t.Fatalf("verified (%+v), want %s at line %d", rep, tt.kind, tt.line)
			}
			if p.Kind != tt.kind || p.Line != tt.line || p.Seq != tt.seq || p.File != "audit.log" {
				t.Errorf("problem %v\nwant %s at audit.log:%d (seq %d)", p, tt.kind, tt.line, tt.seq)
			}
		})
	}
}

// A trail in several files, given oldest first, verifies as one; its
// later file alone begins mid-chain.
func TestVerifySeveralFiles(t *testing.T) {
	signer, keys := testKey(t, 1, "k1")
	trail := sampleTrail(t, signer)
	first, second := strings.Join(trail[:8], ""), strings.Join(trail[8:], "")
	rep, err := Verify(VerifyOptions{Keys: keys}, Input{"audit.log.1", strings.NewReader(first)}, Input{"audit.log", strings.NewReader(second)})
	if err != nil || rep.Problem != nil || rep.LastSeq != 15 {
		t.Fatalf("two files in order: %+v, %v, %v", rep, rep.Problem, err)
	}
	rep, _ = Verify(VerifyOptions{Keys: keys}, Input{"audit.log", strings.NewReader(second)})
	if p := rep.Problem; p == nil || p.Kind != KindRemoved || p.File != "audit.log" || p.Line != 1 {
		t.Errorf("the later file alone: %v, want removed at audit.log:1", p)
	}
	rep, _ = Verify(VerifyOptions{Keys: keys}, Input{"audit.log", strings.NewReader(second)}, Input{"audit.log.1", strings.NewReader(first)})
	if p := rep.Problem; p == nil || p.Kind != KindRemoved {
		t.Errorf("files out of order: %v, want removed", p)
	}
}

// A trail capsnap is still writing passes with Live while its unsigned
// tail is younger than the checkpoint interval, and not after.
func TestVerifyLive(t *testing.T) {
	signer, keys := testKey(t, 1, "k1")
	w := sampleWriting(t, signer, 6) // a checkpoint after 4, then 2 lines
	defer w.t.Close()
	live := w.out.String()
	written := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) // decisionLine's time
	for _, tc := range []struct {
		name string
		live bool
		now  time.Time
		kind Kind
	}{
		{"not live", false, written, KindTruncated},
		{"live, tail young", true, written.Add(3 * time.Second), ""},
		{"live, tail overdue", true, written.Add(time.Hour + LiveGrace + time.Second), KindTruncated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Verify(VerifyOptions{Keys: keys, Live: tc.live, Now: func() time.Time { return tc.now }}, Input{"audit.log", strings.NewReader(live)})
			if err != nil {
				t.Fatal(err)
			}
			if tc.kind == "" {
				if rep.Problem != nil || rep.Pending != 2 || rep.Final {
					t.Errorf("report %+v, %v; want verified with 2 pending", rep, rep.Problem)
				}
				return
			}
			if rep.Problem == nil || rep.Problem.Kind != tc.kind {
				t.Errorf("problem %v, want %s", rep.Problem, tc.kind)
			}
		})
	}
	// Idle since its last checkpoint: nothing pending, however long.
	idle := strings.Join(strings.SplitAfter(live, "\n")[:5], "")
	rep, _ := Verify(VerifyOptions{Keys: keys, Live: true, Now: func() time.Time { return written.Add(24 * time.Hour) }}, Input{"audit.log", strings.NewReader(idle)})
	if rep.Problem != nil || rep.Pending != 0 {
		t.Errorf("idle live trail: %+v, %v", rep, rep.Problem)
	}
}
