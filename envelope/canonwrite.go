package envelope

import (
	"slices"
	"unicode/utf8"
)

// Writing: the canonicalizer writes its nodes in RFC 8785 form, members
// sorted by their names' UTF-16 code units, strings with RFC 8785's escapes.

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
