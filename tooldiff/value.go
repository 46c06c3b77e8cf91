package tooldiff

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// null is JSON's null in the tree Parse decodes a definition into, whose
// values are map[string]any, []any, string, bool, number and null. A nil
// any stands for an absent member, which is how the comparisons tell an
// absent member from a null one.
type null struct{}

func (null) MarshalJSON() ([]byte, error) { return []byte("null"), nil }

// MarshalJSON writes the number as the server did.
func (n number) MarshalJSON() ([]byte, error) { return []byte(n.text), nil }

// equal reports whether two values of the tree are the same JSON value:
// object members in any order, numbers by value.
func equal(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, av := range a {
			if bv, ok := b[k]; !ok || !equal(av, bv) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		return ok && slices.EqualFunc(a, b, equal)
	case number:
		b, ok := b.(number)
		return ok && a.neg == b.neg && a.digits == b.digits && a.exp == b.exp
	}
	// nil, null, bool and string compare with ==; a and b have different
	// dynamic types here only when they differ.
	return a == b
}

// canon appends to sb a text that is the same for two values exactly when
// equal says they are, so that sets of values can be kept in maps.
func canon(sb *strings.Builder, v any) {
	switch v := v.(type) {
	case map[string]any:
		sb.WriteByte('{')
		for _, k := range slices.Sorted(maps.Keys(v)) {
			sb.WriteString(strconv.Quote(k))
			sb.WriteByte(':')
			canon(sb, v[k])
			sb.WriteByte(',')
		}
		sb.WriteByte('}')
	case []any:
		sb.WriteByte('[')
		for _, e := range v {
			canon(sb, e)
			sb.WriteByte(',')
		}
		sb.WriteByte(']')
	case number:
		if v.neg {
			sb.WriteByte('-')
		}
		sb.WriteString("0." + v.digits + "e" + strconv.FormatInt(v.exp, 10))
	case string:
		sb.WriteString(strconv.Quote(v))
	case bool:
		sb.WriteString(strconv.FormatBool(v))
	case null:
		sb.WriteString("null")
	}
}

// encode returns v as JSON, nil for an absent value. Object members come
// out sorted, which keeps a Diff's encoding deterministic.
func encode(v any) json.RawMessage {
	if v == nil {
		return nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// A reviewer reads these; "<" is clearer than "\u003c".
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Every value of a tree Parse built encodes; were one not to, it
		// would be shown as absent rather than as something it is not.
		return nil
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// typeName names the JSON type of a value, for errors.
func typeName(v any) string {
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case number:
		return "number"
	case bool:
		return "boolean"
	}
	return "null"
}

// objectOf returns the members of an object, reading an absent value as
// the empty object.
func objectOf(v any) (map[string]any, bool) {
	if v == nil {
		return nil, true
	}
	m, ok := v.(map[string]any)
	return m, ok
}

// unionKeys returns the member names of a and b, in no particular order:
// no two changes Compare finds have the same Field and Kind, so sorting
// its result by them makes it deterministic.
func unionKeys(a, b map[string]any) []string {
	keys := make([]string, 0, max(len(a), len(b)))
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	return keys
}
