package mcpparse

import (
	"fmt"
	"strconv"
	"unicode/utf16"
)

// The checker's strings and numbers: the scalars whose spelling is where
// parsers part ways (escapes, surrogates, the range of a double).

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
