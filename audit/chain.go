package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// The chain. Every line of a trail ends with two members the trail adds
// before its closing brace:
//
//	...,"chain_seq":N,"chain_prev":"sha256:<hex>"}
//
// chain_seq numbers the lines of a chain from 1, and chain_prev is the
// SHA-256 of the bytes of the line before (the whole line, its own chain
// members included, without its newline); the first line of a chain has
// 64 zeros. A line's hash therefore covers its own fields and, through
// chain_prev, every line before it. (Not "seq": a tools/list decision line
// already has a "seq" of its own, the snapshot store's.)

// Link is where a chain stands: the chain_seq of its last line and the
// SHA-256 of that line. The zero Link is a chain with no line yet.
type Link struct {
	Seq  uint64
	Hash [sha256.Size]byte
}

// next is the Link after l, once line (its bytes, no newline) is written.
func (l Link) next(line []byte) Link {
	return Link{Seq: l.Seq + 1, Hash: sha256.Sum256(line)}
}

const (
	seqMember   = `"chain_seq":`
	prevMember  = `,"chain_prev":"sha256:`
	hashPrefix  = "sha256:"
	hexHashSize = 2 * sha256.Size
	// linkTail is the fixed-length end of every chained line.
	linkTail = len(prevMember) + hexHashSize + len(`"}`)
)

// appendLinked appends obj (a JSON object's bytes, ending in '}', no
// newline) to out with the chain members of the line after prev inserted
// before its closing brace.
func appendLinked(out, obj []byte, prev Link) []byte {
	body := obj[:len(obj)-1]
	out = append(out, body...)
	if !emptyObject(body) {
		out = append(out, ',')
	}
	out = append(out, seqMember...)
	out = strconv.AppendUint(out, prev.Seq+1, 10)
	out = append(out, prevMember...)
	out = hex.AppendEncode(out, prev.Hash[:])
	return append(out, `"}`...)
}

// linkPrefix is how many bytes of appendLinked's line precede its chain
// members: obj without its closing brace, and the comma after its last
// member.
func linkPrefix(obj []byte) int {
	n := len(obj) - 1
	if !emptyObject(obj[:n]) {
		n++
	}
	return n
}

// emptyObject says whether body, an object without its closing brace, has
// no member: '{' and only JSON whitespace after it.
func emptyObject(body []byte) bool {
	return len(bytes.TrimRight(body, " \t\r\n")) == 1
}

// parseLink reads the chain members at the end of line (no newline): the
// line's chain_seq and chain_prev. It accepts exactly the form
// appendLinked writes, so a line it accepts is appendLinked of the line
// without them (see FuzzParseLine).
func parseLink(line []byte) (seq uint64, prev [sha256.Size]byte, ok bool) {
	if len(line) < linkTail+len(seqMember)+2 || line[0] != '{' {
		return 0, prev, false
	}
	tail := line[len(line)-linkTail:]
	if !bytes.HasPrefix(tail, []byte(prevMember)) || !bytes.HasSuffix(tail, []byte(`"}`)) {
		return 0, prev, false
	}
	hexHash := tail[len(prevMember) : len(prevMember)+hexHashSize]
	if !lowerHex(hexHash) {
		return 0, prev, false
	}
	if _, err := hex.Decode(prev[:], hexHash); err != nil {
		return 0, prev, false
	}
	rest := line[:len(line)-linkTail]
	i := len(rest)
	for i > 0 && rest[i-1] >= '0' && rest[i-1] <= '9' {
		i--
	}
	digits := rest[i:]
	if len(digits) == 0 || len(digits) > 20 || (digits[0] == '0') {
		return 0, prev, false
	}
	seq, err := strconv.ParseUint(string(digits), 10, 64)
	if err != nil {
		return 0, prev, false
	}
	rest = rest[:i]
	if !bytes.HasSuffix(rest, []byte(seqMember)) {
		return 0, prev, false
	}
	rest = rest[:len(rest)-len(seqMember)]
	// Before the members: the comma after the line's own last member, or
	// the opening brace of a line that has none.
	switch {
	case len(rest) == 0:
		return 0, prev, false
	case rest[len(rest)-1] == ',':
		if emptyObject(rest[:len(rest)-1]) {
			return 0, prev, false
		}
	case !emptyObject(rest):
		return 0, prev, false
	}
	return seq, prev, true
}

// unlinked is line without the chain members parseLink accepted: the
// object the trail was given.
func unlinked(line []byte) []byte {
	i := bytes.LastIndex(line, []byte(seqMember))
	body := line[:i]
	if body[len(body)-1] == ',' {
		body = body[:len(body)-1]
	}
	return append(body[:len(body):len(body)], '}')
}

func lowerHex(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// hashText is h as a trail writes it: "sha256:" and lowercase hex.
func hashText(h [sha256.Size]byte) string {
	return hashPrefix + hex.EncodeToString(h[:])
}
