package envelope

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
	"unsafe"

	"github.com/gowebpki/jcs"
)

// This file is the RFC 8785 (JCS) canonicalizer ArgsDigest hashes through.
// It runs on every allowed call, where jcs.Transform built a tree of
// strings (about 35 allocations for an ordinary call); this one parses
// into a flat list of spans over the input and writes the canonical form
// into one pooled buffer: it allocates only for a number that is not an
// integer (jcs.NumberToJSON's string), and ArgsDigest only for its result.
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

func (c *canon) skipSpace() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *canon) add(kind uint8, start, end int) int {
	c.nodes = append(c.nodes, node{kind: kind, start: start, end: end, next: len(c.nodes) + 1})
	return len(c.nodes) - 1
}

// value parses the value at c.pos, whitespace before it skipped.
func (c *canon) value() error {
	if c.pos >= len(c.in) {
		return c.unexpected("a value")
	}
	switch b := c.in[c.pos]; {
	case b == '{':
		return c.object()
	case b == '[':
		return c.array()
	case b == '"':
		return c.str()
	case b == '-' || b >= '0' && b <= '9':
		return c.number()
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	}
	return c.unexpected("a value")
}

// delimited reports whether the number or literal just read ends where
// jcs.Transform ends one: at whitespace, ',', ']', '}' or the end.
func (c *canon) delimited() bool {
	if c.pos == len(c.in) {
		return true
	}
	switch c.in[c.pos] {
	case ' ', '\t', '\n', '\r', ',', ']', '}':
		return true
	}
	return false
}

func (c *canon) literal(lit string) error {
	start := c.pos
	if len(c.in)-start < len(lit) || string(c.in[start:start+len(lit)]) != lit {
		return c.fail("invalid literal")
	}
	c.pos += len(lit)
	if !c.delimited() {
		return c.fail("invalid literal")
	}
	c.add(kindLiteral, start, c.pos)
	return nil
}

func (c *canon) digits() int {
	n := 0
	for c.pos < len(c.in) && c.in[c.pos] >= '0' && c.in[c.pos] <= '9' {
		c.pos++
		n++
	}
	return n
}

// number parses an RFC 8259 number. One with no fraction or exponent and
// at most 15 digits is an integer a float64 holds exactly, which ECMAScript
// writes as its digits (and -0 as 0); any other is parsed as a float64,
// and written as its digits if it is an integer below 2^53 (all of which a
// float64 holds exactly, and ECMAScript writes so), else formatted by
// jcs.NumberToJSON.
func (c *canon) number() error {
	start := c.pos
	if c.in[c.pos] == '-' {
		c.pos++
	}
	switch {
	case c.pos < len(c.in) && c.in[c.pos] == '0':
		c.pos++
	case c.digits() == 0:
		return c.fail("invalid number")
	}
	intEnd := c.pos
	if c.pos < len(c.in) && c.in[c.pos] == '.' {
		c.pos++
		if c.digits() == 0 {
			return c.fail("invalid number")
		}
	}
	if c.pos < len(c.in) && (c.in[c.pos] == 'e' || c.in[c.pos] == 'E') {
		c.pos++
		if c.pos < len(c.in) && (c.in[c.pos] == '+' || c.in[c.pos] == '-') {
			c.pos++
		}
		if c.digits() == 0 {
			return c.fail("invalid number")
		}
	}
	if !c.delimited() {
		return c.fail("invalid number")
	}
	tok := c.in[start:c.pos]
	if intEnd == c.pos && len(tok) <= 15 {
		if string(tok) == "-0" {
			start++ // "0"
		}
		c.add(kindNumber, start, c.pos)
		return nil
	}
	f, err := strconv.ParseFloat(string(tok), 64)
	if err != nil {
		return &canonicalError{start, "number out of the range of a float64"}
	}
	from := len(c.text)
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		// An integer (40.0, 4e3): ECMAScript writes its digits, as
		// jcs.NumberToJSON would, without the string that allocates.
		c.text = strconv.AppendInt(c.text, int64(f), 10)
	} else {
		s, err := jcs.NumberToJSON(f)
		if err != nil {
			return &canonicalError{start, "number not representable in JSON"}
		}
		c.text = append(c.text, s...)
	}
	c.add(kindNumberInText, from, len(c.text))
	return nil
}

func (c *canon) enter() error {
	c.depth++
	if c.depth > maxCanonicalDepth {
		return c.fail(fmt.Sprintf("nested deeper than %d", maxCanonicalDepth))
	}
	return nil
}

func (c *canon) array() error {
	if err := c.enter(); err != nil {
		return err
	}
	self := c.add(kindArray, 0, 0)
	c.pos++
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == ']' {
		c.pos++
	} else {
		for {
			if err := c.value(); err != nil {
				return err
			}
			c.skipSpace()
			if c.pos < len(c.in) && c.in[c.pos] == ',' {
				c.pos++
				c.skipSpace()
				continue
			}
			if c.pos < len(c.in) && c.in[c.pos] == ']' {
				c.pos++
				break
			}
			return c.unexpected("',' or ']'")
		}
	}
	c.nodes[self].next = len(c.nodes)
	c.depth--
	return nil
}

// object parses an object into its node followed by, for each member in
// document order, the name's node (whose next is past the member's value)
// and the value's. Members are sorted, and duplicates found, when written.
func (c *canon) object() error {
	if err := c.enter(); err != nil {
		return err
	}
	self := c.add(kindObject, 0, 0)
	c.pos++
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
	} else {
		for {
			if c.pos >= len(c.in) || c.in[c.pos] != '"' {
				return c.unexpected("a member name")
			}
			if err := c.str(); err != nil {
				return err
			}
			name := len(c.nodes) - 1
			c.skipSpace()
			if c.pos >= len(c.in) || c.in[c.pos] != ':' {
				return c.unexpected("':'")
			}
			c.pos++
			c.skipSpace()
			if err := c.value(); err != nil {
				return err
			}
			c.nodes[name].next = len(c.nodes)
			c.skipSpace()
			if c.pos < len(c.in) && c.in[c.pos] == ',' {
				c.pos++
				c.skipSpace()
				continue
			}
			if c.pos < len(c.in) && c.in[c.pos] == '}' {
				c.pos++
				break
			}
			return c.unexpected("',' or '}'")
		}
	}
	c.nodes[self].next = len(c.nodes)
	c.depth--
	return nil
}

// str parses a string. Its content is valid UTF-8 with no control
// character; without a backslash it is already canonical and stays where
// it is, with one it is decoded into c.text.
func (c *canon) str() error {
	c.pos++
	start := c.pos
	for c.pos < len(c.in) {
		b := c.in[c.pos]
		switch {
		case b == '"':
			c.add(kindString, start, c.pos)
			c.pos++
			return nil
		case b == '\\':
			return c.decodeStr(start)
		case b < 0x20:
			return c.fail("control character in a string")
		case b < utf8.RuneSelf:
			c.pos++
		default:
			r, n := utf8.DecodeRune(c.in[c.pos:])
			if r == utf8.RuneError && n <= 1 {
				return c.fail("invalid UTF-8 in a string")
			}
			c.pos += n
		}
	}
	return c.fail("unterminated string")
}

// decodeStr finishes a string whose content began at start and has an
// escape at c.pos, decoding it into c.text.
func (c *canon) decodeStr(start int) error {
	from := len(c.text)
	c.text = append(c.text, c.in[start:c.pos]...)
	for c.pos < len(c.in) {
		b := c.in[c.pos]
		switch {
		case b == '"':
			c.add(kindStringText, from, len(c.text))
			c.pos++
			return nil
		case b == '\\':
			if err := c.escape(); err != nil {
				return err
			}
		case b < 0x20:
			return c.fail("control character in a string")
		case b < utf8.RuneSelf:
			c.text = append(c.text, b)
			c.pos++
		default:
			r, n := utf8.DecodeRune(c.in[c.pos:])
			if r == utf8.RuneError && n <= 1 {
				return c.fail("invalid UTF-8 in a string")
			}
			c.text = append(c.text, c.in[c.pos:c.pos+n]...)
			c.pos += n
		}
	}
	return c.fail("unterminated string")
}

// escape decodes the escape at c.pos into c.text.
func (c *canon) escape() error {
	if c.pos+1 >= len(c.in) {
		c.pos = len(c.in)
		return c.fail("unterminated string")
	}
	var d byte
	switch c.in[c.pos+1] {
	case '"':
		d = '"'
	case '\\':
		d = '\\'
	case '/':
		d = '/'
	case 'b':
		d = '\b'
	case 'f':
		d = '\f'
	case 'n':
		d = '\n'
	case 'r':
		d = '\r'
	case 't':
		d = '\t'
	case 'u':
		r, ok := c.hex4(c.pos + 2)
		if !ok {
			return c.fail(`invalid \u escape`)
		}
		c.pos += 6
		if r >= 0xd800 && r <= 0xdfff {
			if r > 0xdbff {
				return c.fail("lone low surrogate")
			}
			if c.pos+1 >= len(c.in) || c.in[c.pos] != '\\' || c.in[c.pos+1] != 'u' {
				return c.fail("high surrogate without a low one")
			}
			lo, ok := c.hex4(c.pos + 2)
			if !ok {
				return c.fail(`invalid \u escape`)
			}
			if lo < 0xdc00 || lo > 0xdfff {
				return c.fail("high surrogate without a low one")
			}
			c.pos += 6
			r = 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00)
		}
		c.text = utf8.AppendRune(c.text, r)
		return nil
	default:
		return c.fail("invalid escape")
	}
	c.text = append(c.text, d)
	c.pos += 2
	return nil
}

// hex4 reads the four hex digits at i.
func (c *canon) hex4(i int) (rune, bool) {
	if i+4 > len(c.in) {
		return 0, false
	}
	var r rune
	for _, b := range c.in[i : i+4] {
		switch {
		case b >= '0' && b <= '9':
			b -= '0'
		case b >= 'a' && b <= 'f':
			b -= 'a' - 10
		case b >= 'A' && b <= 'F':
			b -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(b)
	}
	return r, true
}

// bytesOf is a string, number or literal node's content.
func (c *canon) bytesOf(n node) []byte {
	switch n.kind {
	case kindStringText, kindNumberInText:
		return c.text[n.start:n.end]
	}
	return c.in[n.start:n.end]
}

// write appends the canonical form of node i and its subtree to dst.
func (c *canon) write(dst []byte, i int) ([]byte, error) {
	n := c.nodes[i]
	switch n.kind {
	case kindString:
		dst = append(dst, '"')
		dst = append(dst, c.in[n.start:n.end]...)
		return append(dst, '"'), nil
	case kindStringText:
		return appendQuoted(dst, c.text[n.start:n.end]), nil
	case kindArray:
		dst = append(dst, '[')
		var err error
		for k := i + 1; k < n.next; k = c.nodes[k].next {
			if k > i+1 {
				dst = append(dst, ',')
			}
			if dst, err = c.write(dst, k); err != nil {
				return dst, err
			}
		}
		return append(dst, ']'), nil
	case kindObject:
		return c.writeObject(dst, i)
	}
	return append(dst, c.bytesOf(n)...), nil
}

// writeObject writes object i's members sorted by their names' UTF-16
// code units, refusing two of the same name.
func (c *canon) writeObject(dst []byte, i int) ([]byte, error) {
	base := len(c.order)
	for k := i + 1; k < c.nodes[i].next; k = c.nodes[k].next {
		c.order = append(c.order, k)
	}
	members := c.order[base:]
	c.sortNames(members)
	for m := 1; m < len(members); m++ {
		if string(c.bytesOf(c.nodes[members[m-1]])) == string(c.bytesOf(c.nodes[members[m]])) {
			return dst, &canonicalError{c.nodes[members[m]].start, "duplicate member name"}
		}
	}
	dst = append(dst, '{')
	var err error
	for m := base; m < len(c.order); m++ {
		if m > base {
			dst = append(dst, ',')
		}
		k := c.order[m] // c.order may grow (and move) below
		if dst, err = c.write(dst, k); err != nil {
			return dst, err
		}
		dst = append(dst, ':')
		if dst, err = c.write(dst, k+1); err != nil {
			return dst, err
		}
	}
	c.order = c.order[:base]
	return append(dst, '}'), nil
}

// insertionSortMax is the member count up to which names are sorted by
// insertion, cheaper than a general sort for the objects of ordinary calls.
const insertionSortMax = 12

func (c *canon) sortNames(members []int) {
	if len(members) > insertionSortMax {
		slices.SortFunc(members, func(a, b int) int {
			return compareUTF16(c.bytesOf(c.nodes[a]), c.bytesOf(c.nodes[b]))
		})
		return
	}
	for m := 1; m < len(members); m++ {
		k := members[m]
		name := c.bytesOf(c.nodes[k])
		j := m
		for ; j > 0 && compareUTF16(c.bytesOf(c.nodes[members[j-1]]), name) > 0; j-- {
			members[j] = members[j-1]
		}
		members[j] = k
	}
}

// compareUTF16 orders two valid UTF-8 strings as RFC 8785 orders member
// names: by their UTF-16 code units. That is their byte order except where
// a character above U+FFFF (a surrogate pair in UTF-16, D800-DFFF) meets
// one in U+E000-U+FFFF, which UTF-8 orders the other way round.
func compareUTF16(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return len(a) - len(b)
	}
	// The first differing byte is in the first differing character, which
	// starts at the same offset in both (they share what precedes it).
	for i > 0 && !utf8.RuneStart(a[i]) {
		i--
	}
	ra, _ := utf8.DecodeRune(a[i:])
	rb, _ := utf8.DecodeRune(b[i:])
	return utf16Rank(ra) - utf16Rank(rb)
}

// utf16Rank maps a character to a number ordered as its first UTF-16 code
// units are (and then as the characters are, as the second units follow
// them): U+E000-U+FFFF are moved above every character past U+FFFF.
func utf16Rank(r rune) int {
	if r >= 0xe000 && r <= 0xffff {
		return int(r) + 0x110000
	}
	return int(r)
}

// appendQuoted appends s (valid UTF-8) as an RFC 8785 string: '"', '\' and
// the control characters escaped, with the short escapes where JSON has
// them and \u00xx (lowercase) otherwise; every other character as itself.
func appendQuoted(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	last := 0
	for i, b := range s {
		if b >= 0x20 && b != '"' && b != '\\' {
			continue
		}
		dst = append(dst, s[last:i]...)
		last = i + 1
		switch b {
		case '"', '\\':
			dst = append(dst, '\\', b)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
		}
	}
	dst = append(dst, s[last:]...)
	return append(dst, '"')
}
