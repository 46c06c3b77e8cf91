package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// Kind is what a Problem found.
type Kind string

// The problems Verify reports.
const (
	// KindRemoved: a chain_seq is missing; the lines before the first
	// line are missing; or a line's predecessor is not the line before it.
	KindRemoved Kind = "removed"
	// KindInserted: a line that is not chained, or a chain_seq that came
	// already.
	KindInserted Kind = "inserted"
	// KindEdited: a line whose hash is not the one the next line records,
	// or a checkpoint whose members are not those it signed.
	KindEdited Kind = "edited"
	// KindReordered: a chain_seq found later than its place.
	KindReordered Kind = "reordered"
	// KindRewritten: a checkpoint whose signature is good but which signs
	// another chain than the one before it: lines before it were changed
	// and the chain recomputed.
	KindRewritten Kind = "rewritten"
	// KindForged: a checkpoint whose signature does not verify, or that is
	// not a checkpoint JWS.
	KindForged Kind = "forged"
	// KindUnknownKey: a checkpoint signed under a kid the JWKS does not
	// hold.
	KindUnknownKey Kind = "unknown_key"
	// KindUnsigned: the chain holds, but a checkpoint carries no
	// signature, so nothing proves that the chain was not rewritten whole.
	KindUnsigned Kind = "unsigned"
	// KindTruncated: the trail does not end with capsnap's shutdown
	// checkpoint (see Verify), or ends in an incomplete line.
	KindTruncated Kind = "truncated"
)

// Problem is the first thing Verify found wrong, and where.
type Problem struct {
	Kind Kind
	// File and Line (from 1) locate the line concerned; Seq is its
	// chain_seq, 0 if it has none.
	File   string
	Line   int
	Seq    uint64
	Detail string
}

func (p *Problem) Error() string {
	seq := ""
	if p.Seq != 0 {
		seq = fmt.Sprintf(" (seq %d)", p.Seq)
	}
	return fmt.Sprintf("%s:%d%s: %s: %s", p.File, p.Line, seq, p.Kind, p.Detail)
}

// Report is what Verify found.
type Report struct {
	// Lines is the lines read; Chains the chains they hold (more than one
	// where a capsnap started without resuming the chain before, as on
	// stdout); LastSeq the last line's chain_seq.
	Lines   int
	Chains  int
	LastSeq uint64
	// Checkpoints is the signed checkpoints verified, and KeyIDs the kids
	// that signed them.
	Checkpoints int
	KeyIDs      []string
	// Final says the trail ends with capsnap's shutdown checkpoint.
	Final bool
	// Pending is, with VerifyOptions.Live, the lines after the last
	// checkpoint that no checkpoint covers yet.
	Pending int
	// Problem is nil when the trail verified.
	Problem *Problem
}

// Input is one file of a trail, named for the report.
type Input struct {
	Name string
	R    io.Reader
}

// VerifyOptions configure Verify.
type VerifyOptions struct {
	// Keys are the public keys checkpoints may be signed with (capsnap's
	// JWKS).
	Keys jose.JSONWebKeySet
	// Live accepts a trail capsnap is still writing: one that ends
	// without its shutdown checkpoint, provided no line after the last
	// checkpoint has waited longer than the checkpoint interval (and
	// LiveGrace) for one.
	Live bool
	// Now is the clock Live judges by; nil is time.Now.
	Now func() time.Time
}

// LiveGrace is how much longer than its checkpoint interval a line may
// wait for a checkpoint in a live trail: the time to write a batch, and
// clock skew between capsnap and the verifier.
const LiveGrace = 5 * time.Second

// position is a line of the input.
type position struct {
	file string
	line int
	seq  uint64
}

// Verify reads a trail (its files in the order written, oldest first),
// recomputes its chain and verifies each checkpoint's signature, and
// reports the first problem.
//
// Every line must be chained: its chain_seq one more than the line
// before's and its chain_prev that line's hash. The first line must begin
// a chain (chain_seq 1); a new chain may begin later only right after a
// shutdown checkpoint. Every checkpoint must be signed by a key of the
// JWKS, with the header typ CheckpointType, and sign the chain_seq and
// hash of the line before it.
//
// Truncation: lines after the last checkpoint are covered by no
// signature, so removing them would leave no trace but for one rule: a
// trail must end with capsnap's shutdown checkpoint ("final": true),
// which capsnap writes on Close. A trail that ends otherwise is
// KindTruncated: lines were removed from its end, or capsnap crashed or
// is still writing it. With Live, a trail still being written passes
// while every line after its last checkpoint is younger than the
// checkpoint interval (and LiveGrace): the window in which a line may
// wait for its checkpoint, and in which its removal cannot be told.
//
// The error is for an input that cannot be read; what is wrong with the
// trail is the Report's Problem.
func Verify(o VerifyOptions, inputs ...Input) (*Report, error) {
	v := &verifier{o: o, rep: &Report{}}
	if v.o.Now == nil {
		v.o.Now = time.Now
	}
	for _, in := range inputs {
		if err := v.read(in); err != nil {
			return nil, err
		}
		if v.rep.Problem != nil {
			return v.rep, nil
		}
	}
	v.finish()
	return v.rep, nil
}

type verifier struct {
	o    VerifyOptions
	rep  *Report
	file string // the input being read

	started bool
	head    Link     // the last line's chain_seq and hash
	prev    position // the last line
	// final: the last line is a signed shutdown checkpoint; ended: it is a
	// shutdown checkpoint, signed or not.
	final, ended bool
	// signed is the last signed checkpoint, and interval its interval;
	// uncovered is the first line after it, uncoveredLine its bytes.
	signed, uncovered position
	interval          time.Duration
	uncoveredLine     []byte
	pending           int
	// unsigned is the first unsigned checkpoint: reported if nothing
	// worse is found.
	unsigned *Problem
	// torn: the last line read had no newline.
	torn bool
	// gap is a missing chain_seq being looked for further on.
	gap *Problem
	// gapSeq is the chain_seq gap is missing.
	gapSeq uint64
	// suspect is a line whose chain_prev is not its predecessor's hash,
	// and suspectHash its own: the line after tells which of the two was
	// edited.
	suspect     *position
	suspectHash [sha256.Size]byte
}

func (v *verifier) read(in Input) error {
	v.file = in.Name
	r := bufio.NewReaderSize(in.R, 64<<10)
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("audit: read %s: %w", in.Name, err)
		}
		if len(line) == 0 {
			return nil
		}
		at := position{file: in.Name, line: n}
		v.torn = line[len(line)-1] != '\n'
		line = bytes.TrimSuffix(line, []byte("\n"))
		switch {
		case v.gap != nil:
			v.seek(at, line)
		case v.suspect != nil:
			v.judge(at, line)
		default:
			v.line(at, line)
		}
		if v.rep.Problem != nil {
			return nil
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
	}
}

func (v *verifier) fail(kind Kind, at position, format string, args ...any) {
	v.rep.Problem = &Problem{Kind: kind, File: at.file, Line: at.line, Seq: at.seq, Detail: fmt.Sprintf(format, args...)}
}

func (at position) String() string { return fmt.Sprintf("%s:%d", at.file, at.line) }

// line checks one line of the trail.
func (v *verifier) line(at position, line []byte) {
	if v.torn {
		v.fail(KindTruncated, at, "the last line is incomplete (no newline): cut short, or torn by a crash")
		return
	}
	seq, prev, ok := parseLink(line)
	if !ok {
		v.fail(KindInserted, at, "not a chained trail line (no chain_seq and chain_prev at its end): inserted, or torn by a crash")
		return
	}
	at.seq = seq
	v.rep.Lines++
	switch {
	case !v.started && (seq != 1 || prev != [sha256.Size]byte{}):
		v.fail(KindRemoved, at, "the trail begins at seq %d, whose predecessor is not here: the lines before it were removed (or are in an earlier file: give that first)", seq)
		return
	case !v.started:
		v.rep.Chains = 1
	case seq == v.head.Seq+1 && prev == v.head.Hash:
	case seq == 1 && prev == [sha256.Size]byte{}:
		if !v.ended {
			v.fail(KindTruncated, at, "a new chain begins here, but the chain before it ends at %s (seq %d) without its shutdown checkpoint: lines were removed from its end, or capsnap crashed", v.prev, v.prev.seq)
			return
		}
		v.rep.Chains++
	case seq == v.head.Seq+1:
		v.suspect, v.suspectHash = &at, sha256.Sum256(line)
		return
	case seq > v.head.Seq+1:
		v.gap, v.gapSeq = &Problem{Kind: KindRemoved, File: at.file, Line: at.line, Seq: seq}, v.head.Seq+1
		if seq == v.head.Seq+2 {
			v.gap.Detail = fmt.Sprintf("seq %d is missing between %s (seq %d) and this line", v.head.Seq+1, v.prev, v.head.Seq)
		} else {
			v.gap.Detail = fmt.Sprintf("seqs %d..%d are missing between %s (seq %d) and this line", v.head.Seq+1, seq-1, v.prev, v.head.Seq)
		}
		return
	default:
		v.fail(KindInserted, at, "seq %d comes after seq %d (%s): a line inserted, repeated or moved here", seq, v.head.Seq, v.prev)
		return
	}
	v.started = true
	v.head, v.prev = Link{Seq: seq, Hash: sha256.Sum256(line)}, at
	v.rep.LastSeq = seq
	v.final, v.ended = false, false
	if bytes.HasPrefix(line, []byte(checkpointPrefix)) {
		v.checkpoint(at, line, prev)
		return
	}
	if v.uncoveredLine == nil {
		v.uncovered, v.uncoveredLine = at, line
	}
	v.pending++
}

// seek looks on after a gap for the chain_seq it misses: found, the lines
// were moved, not removed.
func (v *verifier) seek(at position, line []byte) {
	seq, prev, ok := parseLink(line)
	switch {
	case ok && seq == v.gapSeq:
		v.fail(KindReordered, position{v.gap.File, v.gap.Line, v.gap.Seq},
			"seq %d is not here, after %s (seq %d), but later, at %s: lines were moved", v.gapSeq, v.prev, v.gapSeq-1, at)
	case !ok || seq == 1 && prev == [sha256.Size]byte{}, v.torn:
		// Another chain, or the end: the seq is not further on.
		v.rep.Problem = v.gap
	}
}

// judge decides, from the line after it, which line around a broken link
// was edited: the line before the suspect if the line after records the
// suspect's hash (the suspect is as written), else the suspect itself.
func (v *verifier) judge(at position, line []byte) {
	s := *v.suspect
	seq, prev, ok := parseLink(line)
	switch {
	case !ok || v.torn:
		v.editedBefore()
	case seq == s.seq+1 && prev == v.suspectHash:
		v.fail(KindEdited, v.prev, "its hash is not the chain_prev the next line (%s, seq %d) records for it", s, s.seq)
	default:
		v.fail(KindEdited, s, "its chain_prev is not the hash of the line before (%s), and the line after does not record its hash", v.prev)
	}
}

// editedBefore reports the line before the suspect edited, when nothing
// follows the suspect to tell.
func (v *verifier) editedBefore() {
	s := *v.suspect
	v.fail(KindEdited, v.prev, "its hash is not the chain_prev the next line (%s, seq %d) records for it (or that line's chain_prev was edited)", s, s.seq)
}

func (v *verifier) checkpoint(at position, line []byte, prev [sha256.Size]byte) {
	var c struct {
		checkpointLine
		ChainSeq  uint64 `json:"chain_seq"`
		ChainPrev string `json:"chain_prev"`
	}
	if err := json.Unmarshal(line, &c); err != nil {
		v.fail(KindEdited, at, "a checkpoint line that does not decode: %v", err)
		return
	}
	if c.JWS == "" {
		v.ended = c.Final
		if v.unsigned == nil {
			why := "capsnap had no signing key"
			if c.SignError != "" {
				why = "signing failed: " + c.SignError
			}
			v.unsigned = &Problem{Kind: KindUnsigned, File: at.file, Line: at.line, Seq: at.seq,
				Detail: fmt.Sprintf("the checkpoint of seq %d carries no signature (%s): nothing proves the chain was not rewritten whole", c.Seq, why)}
		}
		return
	}
	jws, err := jose.ParseSignedCompact(c.JWS, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		v.fail(KindForged, at, "the checkpoint's jws is not a compact EdDSA JWS: %v", err)
		return
	}
	h := jws.Signatures[0].Protected
	if typ, _ := h.ExtraHeaders[jose.HeaderType].(string); typ != CheckpointType {
		v.fail(KindForged, at, "the checkpoint's jws has typ %q, not %q: not a checkpoint signature", typ, CheckpointType)
		return
	}
	keys := v.o.Keys.Key(h.KeyID)
	if len(keys) == 0 {
		v.fail(KindUnknownKey, at, "the checkpoint is signed by kid %q, which the JWKS does not hold", h.KeyID)
		return
	}
	var payload []byte
	for _, k := range keys {
		if payload, err = jws.Verify(k.Public()); err == nil {
			break
		}
	}
	if err != nil {
		v.fail(KindForged, at, "the checkpoint's signature does not verify under kid %q", h.KeyID)
		return
	}
	var signed checkpointPayload
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&signed); err != nil {
		v.fail(KindForged, at, "the checkpoint's signed payload is not a checkpoint: %v", err)
		return
	}
	if signed.Seq != at.seq-1 || signed.Head != hashText(prev) {
		since := "the start of the trail"
		if v.signed.line != 0 {
			since = fmt.Sprintf("the checkpoint at %s", v.signed)
		}
		v.fail(KindRewritten, at, "the checkpoint signs seq %d with head %s, but here it follows seq %d with head %s: lines since %s were changed and the chain recomputed",
			signed.Seq, signed.Head, at.seq-1, hashText(prev), since)
		return
	}
	if c.checkpointPayload != signed {
		v.fail(KindEdited, at, "the checkpoint's members are not those its signature signs")
		return
	}
	v.rep.Checkpoints++
	if !slices.Contains(v.rep.KeyIDs, h.KeyID) {
		v.rep.KeyIDs = append(v.rep.KeyIDs, h.KeyID)
	}
	v.signed, v.interval = at, time.Duration(signed.IntervalMS)*time.Millisecond
	v.uncoveredLine, v.pending = nil, 0
	v.final, v.ended = signed.Final, signed.Final
}

// finish judges the end of the trail.
func (v *verifier) finish() {
	switch {
	case v.gap != nil:
		v.rep.Problem = v.gap
		return
	case v.suspect != nil:
		v.editedBefore()
		return
	case !v.started:
		v.fail(KindTruncated, position{file: v.file}, "no trail lines: nothing to verify")
		return
	case v.unsigned != nil:
		v.rep.Problem = v.unsigned
		return
	case v.final:
		v.rep.Final = true
	case !v.o.Live:
		var tail string
		switch {
		case v.signed.line == 0:
			tail = fmt.Sprintf("no signed checkpoint covers any of its %d lines", v.pending)
		case v.pending == 0:
			tail = fmt.Sprintf("it ends at the checkpoint at %s, which is not the shutdown one", v.signed)
		default:
			tail = fmt.Sprintf("no signed checkpoint covers the %d lines after the last one, at %s", v.pending, v.signed)
		}
		v.fail(KindTruncated, v.prev, "the trail ends without capsnap's shutdown checkpoint; %s: lines may have been removed from the end (or capsnap crashed, or is still writing it: verify a live file with --live)", tail)
		return
	case v.uncoveredLine != nil:
		interval := v.interval
		if interval == 0 {
			interval = DefaultCheckpointInterval
		}
		var l struct {
			Time time.Time `json:"time"`
		}
		if err := json.Unmarshal(v.uncoveredLine, &l); err != nil || l.Time.IsZero() {
			v.fail(KindTruncated, v.uncovered, "no checkpoint covers this line, and it has no time to tell whether one is still due")
			return
		}
		if age := v.o.Now().Sub(l.Time); age > interval+LiveGrace {
			v.fail(KindTruncated, v.uncovered, "no checkpoint covers this line, written %s ago, though one is due within %s: lines were removed from the end, or capsnap stopped without its shutdown checkpoint",
				age.Round(time.Second), interval)
			return
		}
		v.rep.Pending = v.pending
	}
}
