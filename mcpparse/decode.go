package mcpparse

import (
	"encoding/json"
	"errors"
)

// DecodeObject decodes a JSON object, such as a tools/call's arguments, into
// the values encoding/json's UseNumber gives: map[string]any, []any,
// string, json.Number, bool and nil. It holds the document to checkJSON's
// rules first (one reading only, no number beyond a double, nesting no
// deeper than any configuration may allow: Parse has applied the
// configured bound already), so what it returns is what every server reads.
//
// It exists because encoding/json spends a dozen allocations on an ordinary
// set of arguments, a third of a Check's budget: here every string and
// number without escapes is a slice of one copy of data.
func DecodeObject(data []byte) (map[string]any, error) {
	if err := checkJSON(data, maxDepthCap, false); err != nil {
		return nil, err
	}
	return decodeChecked(data)
}

// decodeChecked is DecodeObject of data that checkJSON has accepted.
func decodeChecked(data []byte) (map[string]any, error) {
	doc := trimValue(data)
	if doc[0] != '{' {
		return nil, errors.New("not a JSON object")
	}
	d := decoder{text: string(doc)}
	return d.object(doc, 0), nil
}

// DecodeArguments decodes a tools/call's Arguments as DecodeObject does,
// an empty object when there are none. Arguments that Parse read are not
// checked again: Parse checked the whole body, under rules at least as
// strict (names folded, the configured depth), and a part of a checked
// document is itself one.
func (m *Message) DecodeArguments() (map[string]any, error) {
	switch {
	case len(m.Arguments) == 0:
		return map[string]any{}, nil
	case m.checked:
		return decodeChecked(m.Arguments)
	}
	return DecodeObject(m.Arguments)
}

// decoder builds values from a checked document. text is the document as
// one string; a span at offset off of the document is text[off:off+n].
type decoder struct {
	text string
}

// at returns the string of span v, which starts off bytes into the document.
func (d *decoder) at(off int, v []byte) string { return d.text[off : off+len(v)] }

// str returns the text of the quoted string v at off.
func (d *decoder) str(off int, v []byte) string {
	for _, c := range v {
		if c == '\\' {
			return unquote(v)
		}
	}
	return d.at(off+1, v[1:len(v)-1])
}

func (d *decoder) value(v []byte, off int) any {
	switch v[0] {
	case '{':
		return d.object(v, off)
	case '[':
		return d.array(v, off)
	case '"':
		return d.str(off, v)
	case 't':
		return true
	case 'f':
		return false
	case 'n':
		return nil
	}
	return json.Number(d.at(off, v))
}

func (d *decoder) object(obj []byte, off int) map[string]any {
	out := map[string]any{}
	m := membersOf(obj)
	for {
		name, v, ok := m.next()
		if !ok {
			return out
		}
		out[d.str(off+offsetIn(obj, name), name)] = d.value(v, off+offsetIn(obj, v))
	}
}

func (d *decoder) array(arr []byte, off int) []any {
	out := []any{}
	e := elementsOf(arr)
	for {
		v, ok := e.next()
		if !ok {
			return out
		}
		out = append(out, d.value(v, off+offsetIn(arr, v)))
	}
}

// offsetIn is where sub, a subslice of outer, starts in it.
func offsetIn(outer, sub []byte) int { return cap(outer) - cap(sub) }
