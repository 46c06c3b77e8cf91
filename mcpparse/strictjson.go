package mcpparse

import (
	"bytes"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// This file is the one pass over the raw bytes that decides whether a
// document has exactly one reading. It is I-JSON (RFC 7493) plus two rules
// of capsnap's own, and it is written out here rather than built from
// encoding/json's Decoder.Token because Token allocates for every key and
// string (about forty allocations for an ordinary tools/call), which is the
// whole budget of a Check. The fuzz tests hold it to jcs.Transform and
// encoding/json as oracles: whatever it accepts, both of them accept.

// syntaxError says where and why a document was refused. The message never
// quotes more than a bounded excerpt of the input.
type syntaxError struct {
	off int
	msg string
}

func (e *syntaxError) Error() string { return fmt.Sprintf("at byte %d: %s", e.off, e.msg) }

// excerptLen bounds how much of a client's input is copied into a detail,
// an audit line or a log: an error must never become a way to write
// megabytes of attacker-chosen text into them.
const excerptLen = 40

// excerpt quotes b for a detail, truncated to excerptLen bytes. Quoting
// keeps control characters and newlines out of log lines.
func excerpt[T ~string | ~[]byte](b T) string {
	if len(b) <= excerptLen {
		return strconv.Quote(string(b))
	}
	// Cut on a rune boundary so the excerpt stays valid UTF-8.
	n := excerptLen
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return strconv.Quote(string(b[:n])) + fmt.Sprintf("… (%d bytes)", len(b))
}

// pairwiseKeys is the member count up to which an object's keys are
// compared pairwise. Past it a map of folded keys takes over, so that an
// object with many members costs O(n), not O(n²).
const pairwiseKeys = 16

// checker validates one document.
type checker struct {
	data     []byte
	pos      int
	depth    int
	maxDepth int
	// fold makes keys that are equal under Unicode simple case folding
	// count as duplicates, not only byte-identical ones. encoding/json
	// (and so every Go server that decodes arguments into a struct with it)
	// matches members to fields case-insensitively and keeps the last
	// match: {"amount":1,"AMOUNT":9999} would be checked as 1 by capsnap and
	// paid as 9999 by the handler.
	fold bool
	// unescaped holds the decoded form of keys written with escapes;
	// keyRefs with decoded set point into it.
	unescaped []byte
}

// keyRef locates a member name: in the document, or decoded in unescaped.
type keyRef struct {
	start, end int
	decoded    bool
}

func (c *checker) key(k keyRef) []byte {
	if k.decoded {
		return c.unescaped[k.start:k.end]
	}
	return c.data[k.start:k.end]
}

// checkJSON reports whether data is exactly one JSON value that every
// conforming parser reads the same way:
//   - valid UTF-8 throughout, and no byte order mark: a decoder that
//     substitutes U+FFFD (encoding/json does) or skips a BOM reads other
//     text than one that rejects it;
//   - no \u escape naming a lone or misordered surrogate, which decoders
//     variously reject, replace or pass through;
//   - no two members of one object with the same name (or, with fold, the
//     same name up to case): parsers disagree on whether the first or the
//     last one counts;
//   - no number outside the range of an IEEE 754 double, which some
//     parsers turn into an infinity, others into an error or a big number;
//   - nothing but whitespace after the value: a streaming decoder stops
//     after the first value and a buffering one rejects the rest;
//   - nesting no deeper than maxDepth, so that the cost of every later
//     reading is bounded.
func checkJSON(data []byte, maxDepth int, fold bool) error {
	if bytes.HasPrefix(data, []byte("\xef\xbb\xbf")) {
		return &syntaxError{0, "document starts with a UTF-8 byte order mark"}
	}
	if !utf8.Valid(data) {
		off := 0
		for off < len(data) {
			r, n := utf8.DecodeRune(data[off:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			off += n
		}
		return &syntaxError{off, "invalid UTF-8"}
	}
	c := checker{data: data, maxDepth: maxDepth, fold: fold}
	c.skipSpace()
	if c.pos == len(data) {
		return &syntaxError{c.pos, "no JSON value (only whitespace)"}
	}
	if err := c.value(); err != nil {
		return err
	}
	c.skipSpace()
	if c.pos != len(data) {
		return &syntaxError{c.pos, "trailing data after the JSON value: " + excerpt(data[c.pos:])}
	}
	return nil
}

func (c *checker) skipSpace() {
	for c.pos < len(c.data) {
		switch c.data[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *checker) fail(msg string) error { return &syntaxError{c.pos, msg} }

func (c *checker) unexpected(want string) error {
	if c.pos >= len(c.data) {
		return c.fail("unexpected end of document, want " + want)
	}
	r, _ := utf8.DecodeRune(c.data[c.pos:])
	return c.fail(fmt.Sprintf("unexpected %q, want %s", r, want))
}

func (c *checker) value() error {
	if c.pos >= len(c.data) {
		return c.unexpected("a value")
	}
	switch b := c.data[c.pos]; {
	case b == '{':
		return c.object()
	case b == '[':
		return c.array()
	case b == '"':
		_, err := c.str()
		return err
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

func (c *checker) literal(lit string) error {
	if !bytes.HasPrefix(c.data[c.pos:], []byte(lit)) {
		return c.unexpected(lit)
	}
	c.pos += len(lit)
	return nil
}

func (c *checker) enter() error {
	c.depth++
	if c.depth > c.maxDepth {
		return c.fail(fmt.Sprintf("nesting deeper than %d", c.maxDepth))
	}
	return nil
}

func (c *checker) array() error {
	if err := c.enter(); err != nil {
		return err
	}
	c.pos++
	c.skipSpace()
	if c.pos < len(c.data) && c.data[c.pos] == ']' {
		c.pos++
		c.depth--
		return nil
	}
	for {
		c.skipSpace()
		if err := c.value(); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.data) {
			return c.unexpected("',' or ']'")
		}
		switch c.data[c.pos] {
		case ',':
			c.pos++
		case ']':
			c.pos++
			c.depth--
			return nil
		default:
			return c.unexpected("',' or ']'")
		}
	}
}

func (c *checker) object() error {
	if err := c.enter(); err != nil {
		return err
	}
	unescapedMark := len(c.unescaped)
	defer func() { c.unescaped = c.unescaped[:unescapedMark] }()
	// The keys of a small object are compared pairwise, in a frame-local
	// array that costs no allocation; seen takes over from it once the
	// object outgrows it.
	var small [pairwiseKeys]keyRef
	keys := small[:0]
	var seen map[string][]byte
	c.pos++
	c.skipSpace()
	if c.pos < len(c.data) && c.data[c.pos] == '}' {
		c.pos++
		c.depth--
		return nil
	}
	for {
		c.skipSpace()
		if c.pos >= len(c.data) || c.data[c.pos] != '"' {
			return c.unexpected("a member name")
		}
		keyPos := c.pos
		escaped, err := c.str()
		if err != nil {
			return err
		}
		k := keyRef{start: keyPos + 1, end: c.pos - 1}
		if escaped {
			start := len(c.unescaped)
			c.unescaped = appendUnquoted(c.unescaped, c.data[keyPos:c.pos])
			k = keyRef{start: start, end: len(c.unescaped), decoded: true}
		}
		name := c.key(k)
		if seen == nil && len(keys) == pairwiseKeys {
			seen = make(map[string][]byte, 2*pairwiseKeys)
			for _, prev := range keys {
				// Copied: unescaped may be reallocated as it grows.
				seen[c.mapKey(c.key(prev))] = bytes.Clone(c.key(prev))
			}
		}
		switch {
		case seen != nil:
			mk := c.mapKey(name)
			if prev, dup := seen[mk]; dup {
				return c.duplicate(keyPos, prev, name)
			}
			seen[mk] = bytes.Clone(name)
		default:
			for _, p := range keys {
				if prev := c.key(p); bytes.Equal(prev, name) || c.fold && bytes.EqualFold(prev, name) {
					return c.duplicate(keyPos, prev, name)
				}
			}
			keys = append(keys, k)
		}

		c.skipSpace()
		if c.pos >= len(c.data) || c.data[c.pos] != ':' {
			return c.unexpected("':'")
		}
		c.pos++
		c.skipSpace()
		if err := c.value(); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.data) {
			return c.unexpected("',' or '}'")
		}
		switch c.data[c.pos] {
		case ',':
			c.pos++
		case '}':
			c.pos++
			c.depth--
			return nil
		default:
			return c.unexpected("',' or '}'")
		}
	}
}

func (c *checker) mapKey(name []byte) string {
	if c.fold {
		return string(appendFolded(nil, name))
	}
	return string(name)
}

func (c *checker) duplicate(off int, prev, name []byte) error {
	if bytes.Equal(prev, name) {
		return &syntaxError{off, "duplicate member name " + excerpt(name)}
	}
	return &syntaxError{off, fmt.Sprintf("member names %s and %s differ only in letter case", excerpt(prev), excerpt(name))}
}

// appendFolded appends the case-folded form of name, under which two names
// are equal exactly when bytes.EqualFold says so: that is how encoding/json
// matches members to struct fields, including the Kelvin sign and long s.
func appendFolded(out, name []byte) []byte {
	for i := 0; i < len(name); {
		if b := name[i]; b < utf8.RuneSelf {
			if 'a' <= b && b <= 'z' {
				b -= 'a' - 'A'
			}
			out = append(out, b)
			i++
			continue
		}
		r, n := utf8.DecodeRune(name[i:])
		for {
			f := unicode.SimpleFold(r)
			if f <= r {
				r = f
				break
			}
			r = f
		}
		out = utf8.AppendRune(out, r)
		i += n
	}
	return out
}

// plainStringByte marks the bytes a string may hold as they are: all but
// the quote, the backslash and the C0 controls. UTF-8 sequences were
// validated before the scan.
var plainStringByte = func() (t [256]bool) {
	for b := 0x20; b < 256; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// str checks the string starting at the opening quote and reports whether
// it holds any escape.
func (c *checker) str() (escaped bool, err error) {
	c.pos++
	for c.pos < len(c.data) {
		for c.pos < len(c.data) && plainStringByte[c.data[c.pos]] {
			c.pos++
		}
		if c.pos == len(c.data) {
			break
		}
		switch b := c.data[c.pos]; {
		case b == '"':
			c.pos++
			return escaped, nil
		case b < 0x20:
			return false, c.fail(fmt.Sprintf("control character %U in a string must be escaped", rune(b)))
		}
		escaped = true
		if c.pos+1 >= len(c.data) {
			return false, c.fail("unterminated escape")
		}
		switch c.data[c.pos+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			c.pos += 2
		case 'u':
			r, ok := hex4(c.data[c.pos+2:])
			if !ok {
				return false, c.fail(`\u must be followed by four hex digits`)
			}
			switch {
			case utf16.IsSurrogate(r) && r >= 0xDC00:
				return false, c.fail(fmt.Sprintf(`\u%04X is a low surrogate without a high one before it`, r))
			case utf16.IsSurrogate(r):
				lo, ok := rune(0), len(c.data) >= c.pos+12 && c.data[c.pos+6] == '\\' && c.data[c.pos+7] == 'u'
				if ok {
					lo, ok = hex4(c.data[c.pos+8:])
				}
				if !ok || lo < 0xDC00 || lo > 0xDFFF {
					return false, c.fail(fmt.Sprintf(`\u%04X is a high surrogate not followed by a low one`, r))
				}
				c.pos += 12
			default:
				c.pos += 6
			}
		default:
			return false, c.fail("invalid escape " + excerpt(c.data[c.pos:c.pos+2]))
		}
	}
	return false, c.fail("unterminated string")
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, h := range b[:4] {
		switch {
		case '0' <= h && h <= '9':
			h -= '0'
		case 'a' <= h && h <= 'f':
			h -= 'a' - 10
		case 'A' <= h && h <= 'F':
			h -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(h)
	}
	return r, true
}

// maxDecimalExponent is the decimal order of magnitude of the largest
// finite double (1.797…e308).
const maxDecimalExponent = 308

// number checks the RFC 8259 number grammar and that the value is within
// the range of a double. Only numbers whose magnitude is within one order of
// the limit are handed to strconv; the rest are decided from their digits.
func (c *checker) number() error {
	start := c.pos
	if c.data[c.pos] == '-' {
		c.pos++
	}
	intStart := c.pos
	switch {
	case c.pos < len(c.data) && c.data[c.pos] == '0':
		c.pos++
	case c.pos < len(c.data) && '1' <= c.data[c.pos] && c.data[c.pos] <= '9':
		c.digits()
	default:
		return c.unexpected("a digit")
	}
	intEnd := c.pos
	fracStart, fracEnd := c.pos, c.pos
	if c.pos < len(c.data) && c.data[c.pos] == '.' {
		c.pos++
		fracStart = c.pos
		if c.digits() == 0 {
			return c.unexpected("a digit after '.'")
		}
		fracEnd = c.pos
	}
	var exp int64
	if c.pos < len(c.data) && (c.data[c.pos] == 'e' || c.data[c.pos] == 'E') {
		c.pos++
		neg := false
		if c.pos < len(c.data) && (c.data[c.pos] == '+' || c.data[c.pos] == '-') {
			neg = c.data[c.pos] == '-'
			c.pos++
		}
		expStart := c.pos
		if c.digits() == 0 {
			return c.unexpected("a digit in the exponent")
		}
		for _, d := range c.data[expStart:c.pos] {
			// Saturate far beyond any order of magnitude the digits of a
			// document can reach, so the comparison below stays exact.
			if exp < 1<<40 {
				exp = exp*10 + int64(d-'0')
			}
		}
		if neg {
			exp = -exp
		}
	}
	// The order of magnitude of the leading significant digit.
	var mag int64
	switch {
	case c.data[intStart] != '0':
		mag = int64(intEnd - intStart - 1)
	default:
		i := fracStart
		for i < fracEnd && c.data[i] == '0' {
			i++
		}
		if i == fracEnd {
			return nil // zero, whatever the exponent
		}
		mag = -int64(i - fracStart + 1)
	}
	switch mag += exp; {
	case mag < maxDecimalExponent:
		return nil
	case mag == maxDecimalExponent:
		if _, err := strconv.ParseFloat(string(c.data[start:c.pos]), 64); err == nil {
			return nil
		}
	}
	return &syntaxError{start, "number " + excerpt(c.data[start:c.pos]) + " is beyond the range of a double"}
}

func (c *checker) digits() int {
	n := 0
	for c.pos < len(c.data) && '0' <= c.data[c.pos] && c.data[c.pos] <= '9' {
		c.pos++
		n++
	}
	return n
}

// The functions below read documents checkJSON has accepted; they do not
// validate again and must not be given anything else.

// appendUnquoted appends the text of the quoted JSON string s.
func appendUnquoted(dst, s []byte) []byte {
	s = s[1 : len(s)-1]
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			j := bytes.IndexByte(s[i:], '\\')
			if j < 0 {
				return append(dst, s[i:]...)
			}
			dst = append(dst, s[i:i+j]...)
			i += j
			continue
		}
		switch s[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, _ := hex4(s[i+2:])
			if utf16.IsSurrogate(r) {
				lo, _ := hex4(s[i+8:])
				r = utf16.DecodeRune(r, lo)
				i += 6
			}
			dst = utf8.AppendRune(dst, r)
			i += 6
			continue
		default: // '"', '\\', '/'
			dst = append(dst, s[i+1])
		}
		i += 2
	}
	return dst
}

// unquote returns the text of the quoted JSON string s.
func unquote(s []byte) string {
	if bytes.IndexByte(s, '\\') < 0 {
		return string(s[1 : len(s)-1])
	}
	return string(appendUnquoted(make([]byte, 0, len(s)), s))
}

// nameOf returns the text of the quoted JSON string s, decoding into buf
// only when s has escapes, so that member names are matched without
// allocating.
func nameOf(buf *[64]byte, s []byte) []byte {
	if bytes.IndexByte(s, '\\') < 0 {
		return s[1 : len(s)-1]
	}
	return appendUnquoted(buf[:0], s)
}

// stringIs reports whether the quoted JSON string s has the text want,
// without allocating for the common case of a string with no escapes.
func stringIs(s []byte, want string) bool {
	if bytes.IndexByte(s, '\\') < 0 {
		return string(s[1:len(s)-1]) == want
	}
	var buf [64]byte
	return string(appendUnquoted(buf[:0], s)) == want
}

// skipValue returns the offset just past the value starting at data[i].
func skipValue(data []byte, i int) int {
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for ; i < len(data); i++ {
			switch data[i] {
			case '"':
				i = skipString(data, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return i
	}
	for i < len(data) {
		switch data[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// skipString returns the offset just past the string starting at data[i]:
// the first quote not escaped by an odd run of backslashes.
func skipString(data []byte, i int) int {
	for j := i + 1; ; {
		k := bytes.IndexByte(data[j:], '"')
		if k < 0 {
			return len(data)
		}
		q := j + k
		backslashes := 0
		for p := q - 1; p > i && data[p] == '\\'; p-- {
			backslashes++
		}
		if backslashes%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}

func skipSpace(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// members iterates over the members of a checked object.
type members struct {
	data []byte
	pos  int
}

// membersOf starts an iteration over the object obj, which must be the
// exact span of a checked object.
func membersOf(obj []byte) members { return members{data: obj, pos: 1} }

// next returns the next member's quoted name and its value, both as exact
// spans of the document.
func (m *members) next() (name, value []byte, ok bool) {
	name, at, ok := m.nextName()
	if !ok {
		return nil, nil, false
	}
	end := skipValue(m.data, at)
	m.pos = end
	return name, m.data[at:end], true
}

// nextName returns the next member's quoted name and the offset in the
// object of its value, which it leaves unread: the caller reads it and
// must then set pos just past it. It lets a caller that walks a large
// value anyway (the tools of a tools/list) find its end in that one walk
// instead of skipping it first.
func (m *members) nextName() (name []byte, at int, ok bool) {
	i := skipSpace(m.data, m.pos)
	if i < len(m.data) && m.data[i] == ',' {
		i = skipSpace(m.data, i+1)
	}
	if i >= len(m.data) || m.data[i] != '"' {
		return nil, 0, false
	}
	end := skipString(m.data, i)
	name = m.data[i:end]
	i = skipSpace(m.data, end)
	i = skipSpace(m.data, i+1) // ':'
	m.pos = i
	return name, i, true
}

// elements iterates over the elements of a checked array.
type elements struct {
	data []byte
	pos  int
}

func elementsOf(arr []byte) elements { return elements{data: arr, pos: 1} }

func (e *elements) next() (value []byte, ok bool) {
	i := skipSpace(e.data, e.pos)
	if i < len(e.data) && e.data[i] == ',' {
		i = skipSpace(e.data, i+1)
	}
	if i >= len(e.data) || e.data[i] == ']' {
		return nil, false
	}
	end := skipValue(e.data, i)
	e.pos = end
	return e.data[i:end], true
}

// trimValue returns the exact span of the one value in a checked document.
// checkJSON allowed nothing but whitespace after the value, so its end is
// found from the back; skipping the value would walk it all (a whole
// tools/list response) once more.
func trimValue(data []byte) []byte {
	i := skipSpace(data, 0)
	j := len(data)
	for j > i {
		switch data[j-1] {
		case ' ', '\t', '\n', '\r':
			j--
			continue
		}
		break
	}
	return data[i:j]
}
