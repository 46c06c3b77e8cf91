package mcpparse

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

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
