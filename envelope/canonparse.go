package envelope

import (
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// Parsing: the canonicalizer reads a document into its flat list of nodes,
// refusing whatever jcs.Transform refuses.

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
