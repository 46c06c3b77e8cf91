package envelope

import (
	"fmt"
	"sync"
	"unsafe"
)

// This file (with canonparse.go and canonwrite.go) is the RFC 8785 (JCS)
// canonicalizer ArgsDigest hashes through. It runs on every allowed call,
// where jcs.Transform built a tree of strings (about 35 allocations for an
// ordinary call); this one parses into a flat list of spans over the input
// and writes the canonical form into one pooled buffer: it allocates only
// for a number that is not an integer (jcs.NumberToJSON's string), and
// ArgsDigest only for its result.
//
// It accepts exactly what jcs.Transform accepts and writes the same bytes:
// FuzzArgsDigest holds it to jcs.Transform (and to encoding/json, which
// must find valid whatever it accepts). Numbers are formatted by
// jcs.NumberToJSON itself. In short:
//   - RFC 8259 JSON; whitespace is space, tab, LF and CR only;
//   - valid UTF-8 throughout, no \u escape naming a lone or misordered
//     surrogate, no control character unescaped in a string;
//   - no two members of one object with the same name (after escapes);
//   - numbers within float64 range (1e400 is refused, 1e-400 is 0);
//   - nesting no deeper than maxCanonicalDepth, jcs.Transform's bound;
//   - nothing but whitespace after the value.

// maxCanonicalDepth bounds the nesting of arrays and objects (the
// outermost counts as 1). It is jcs.Transform's own bound (and
// encoding/json's), so that the two agree on every input; capsnap's own
// parser refuses bodies nested deeper than 1000 long before this.
const maxCanonicalDepth = 10000

// Node kinds. A string or key node is raw (its content between the quotes,
// which holds no escape, is already canonical) or decoded (its escapes
// resolved into canon.text).
const (
	kindLiteral      uint8 = iota // in[start:end]: true, false or null
	kindNumber                    // in[start:end], already canonical
	kindNumberInText              // text[start:end], jcs.NumberToJSON's
	kindString                    // in[start:end], raw
	kindStringText                // text[start:end], decoded
	kindArray                     // its elements follow
	kindObject                    // its members (name, then value) follow
)

// node is one value (or one member name) of the document. The nodes of a
// document are in document order, and next is the index just past a
// node's subtree, so that a container's children are found by hopping
// from one to the next.
type node struct {
	kind       uint8
	start, end int
	next       int
}

// canon is the canonicalizer's reusable state.
type canon struct {
	in    []byte
	pos   int
	depth int
	nodes []node
	// text holds decoded strings and reformatted numbers.
	text []byte
	// order is the scratch the members of the objects being written are
	// sorted in, one object's above its parent's.
	order []int
	out   []byte
}

var canonPool = sync.Pool{New: func() any { return new(canon) }}

// pooledCap is the largest buffer a canon keeps for the next call: one
// enormous argument object must not pin its memory in the pool.
const pooledCap = 64 << 10

func (c *canon) release() {
	c.in = nil
	const nodeSize, intSize = int(unsafe.Sizeof(node{})), int(unsafe.Sizeof(0))
	if cap(c.out) > pooledCap || cap(c.text) > pooledCap || cap(c.nodes)*nodeSize > pooledCap || cap(c.order)*intSize > pooledCap {
		return
	}
	canonPool.Put(c)
}

// canonicalError says where and why a document was refused. It never
// quotes the input.
type canonicalError struct {
	off int
	msg string
}

func (e *canonicalError) Error() string { return fmt.Sprintf("at byte %d: %s", e.off, e.msg) }

func (c *canon) fail(msg string) error { return &canonicalError{c.pos, msg} }

func (c *canon) unexpected(want string) error {
	if c.pos >= len(c.in) {
		return c.fail("unexpected end of JSON, want " + want)
	}
	return c.fail(fmt.Sprintf("unexpected byte 0x%02x, want %s", c.in[c.pos], want))
}

// canonicalArgs appends to dst the canonical form of a call's arguments:
// "{}" for none (empty, only whitespace, or null), else the RFC 8785 form
// of the JSON value in args.
func canonicalArgs(c *canon, dst, args []byte) ([]byte, error) {
	c.in, c.pos, c.depth = args, 0, 0
	c.nodes, c.text, c.order = c.nodes[:0], c.text[:0], c.order[:0]
	c.skipSpace()
	if c.pos == len(c.in) {
		return append(dst, "{}"...), nil
	}
	if err := c.value(); err != nil {
		return dst, err
	}
	c.skipSpace()
	if c.pos != len(c.in) {
		return dst, c.fail("data after the JSON value")
	}
	if n := c.nodes[0]; n.kind == kindLiteral && c.in[n.start] == 'n' {
		return append(dst, "{}"...), nil
	}
	return c.write(dst, 0)
}
