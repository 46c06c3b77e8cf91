package mcpparse

import (
	"bytes"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// This file (with strictscalar.go, its strings and numbers) is the one pass
// over the raw bytes that decides whether a document has exactly one
// reading. It is I-JSON (RFC 7493) plus two rules of capsnap's own, and it
// is written out here rather than built from encoding/json's Decoder.Token
// because Token allocates for every key and string (about forty allocations
// for an ordinary tools/call), which is the whole budget of a Check. The
// fuzz tests hold it to jcs.Transform and encoding/json as oracles: whatever
// it accepts, both of them accept.

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
