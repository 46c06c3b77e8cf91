package tooldiff

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxNesting bounds how deeply Parse lets arrays and objects nest, so that
// no definition makes the comparisons recurse without end.
const maxNesting = 1000

// A Definition is one tool definition as Parse read it.
//
// Its exported fields are for the caller to read. Compare works on the
// whole definition as Parse decoded it, which the Definition keeps: a
// Definition must come from Parse, and changing its fields does not change
// what Compare sees.
type Definition struct {
	Name        string
	Title       string // "" when absent
	Description string // "" when absent
	// InputSchema and OutputSchema are the schemas as the server wrote
	// them, nil when absent.
	InputSchema  json.RawMessage
	OutputSchema json.RawMessage

	members map[string]any // the decoded object; see value.go
}

// Parse reads one tool definition, the JSON object a server lists in a
// tools/list result. It refuses input that is not a JSON object, has no
// string name, has a title or description that is not a string, schemas
// that are not objects or booleans, or annotations that are not an object.
//
// Parse also refuses what encoding/json would otherwise read in a way that
// hides a difference: a duplicate member name, invalid UTF-8, an escaped
// lone surrogate, an exponent beyond ±2³¹, and nesting deeper than 1000.
func Parse(raw []byte) (*Definition, error) {
	members, err := decodeObject(raw)
	if err != nil {
		return nil, fmt.Errorf("tooldiff: %w", err)
	}
	def := &Definition{members: members}
	var ok bool
	if def.Name, ok = members["name"].(string); !ok {
		return nil, errors.New("tooldiff: the definition has no string name")
	}
	for _, k := range []string{"title", "description"} {
		if v := members[k]; v != nil {
			if _, ok := v.(string); !ok {
				return nil, fmt.Errorf("tooldiff: %s is a JSON %s, not a string", k, typeName(v))
			}
		}
	}
	def.Title, _ = members["title"].(string)
	def.Description, _ = members["description"].(string)
	for _, k := range []string{"inputSchema", "outputSchema"} {
		switch v := members[k].(type) {
		case nil, bool, map[string]any:
		default:
			return nil, fmt.Errorf("tooldiff: %s is a JSON %s, not an object or a boolean", k, typeName(v))
		}
	}
	switch v := members["annotations"].(type) {
	case nil, map[string]any:
	default:
		return nil, fmt.Errorf("tooldiff: annotations is a JSON %s, not an object", typeName(v))
	}
	// The decoded tree has been checked to be exactly what the text says,
	// so encoding/json now reads the same members from it.
	var rawMembers map[string]json.RawMessage
	if err := json.Unmarshal(raw, &rawMembers); err != nil {
		return nil, fmt.Errorf("tooldiff: %w", err)
	}
	def.InputSchema = rawMembers["inputSchema"]
	def.OutputSchema = rawMembers["outputSchema"]
	return def, nil
}

// decodeObject decodes raw, which must hold exactly one JSON object.
func decodeObject(raw []byte) (map[string]any, error) {
	if err := checkText(raw); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decode(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the definition")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("the definition is a JSON %s, not an object", typeName(v))
	}
	return obj, nil
}

// decode reads the next value from dec into the tree described in value.go.
func decode(dec *json.Decoder, depth int) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok := tok.(type) {
	case nil:
		return null{}, nil
	case bool, string:
		return tok, nil
	case json.Number:
		return parseNumber(string(tok))
	case json.Delim:
		if depth == maxNesting {
			return nil, fmt.Errorf("nested more than %d deep", maxNesting)
		}
		switch tok {
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := decode(dec, depth+1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := dec.Token()
			return arr, err
		case '{':
			obj := map[string]any{}
			for dec.More() {
				tok, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, ok := tok.(string)
				if !ok {
					return nil, fmt.Errorf("member name %v is not a string", tok)
				}
				// encoding/json keeps the last of two members of one
				// name, other parsers the first: which one a client read
				// cannot be known, so neither is compared.
				if _, dup := obj[k]; dup {
					return nil, fmt.Errorf("duplicate member %q", k)
				}
				if obj[k], err = decode(dec, depth+1); err != nil {
					return nil, err
				}
			}
			_, err := dec.Token()
			return obj, err
		}
	}
	return nil, fmt.Errorf("unexpected %v", tok)
}

// checkText refuses the two things encoding/json quietly decodes to U+FFFD,
// invalid UTF-8 and an escaped lone surrogate, so that two definitions
// differing only there are not reported equal.
func checkText(raw []byte) error {
	if !utf8.Valid(raw) {
		return errors.New("the definition is not valid UTF-8")
	}
	// Outside strings a backslash is a syntax error the decoder reports,
	// so every backslash that matters starts an escape.
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if i == len(raw) || raw[i] != 'u' {
			continue
		}
		r, ok := hex4(raw[i+1:])
		if !ok || !utf16.IsSurrogate(r) {
			continue
		}
		i += 4
		if r < 0xdc00 && i+6 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
			if lo, ok := hex4(raw[i+3:]); ok && lo >= 0xdc00 && lo <= 0xdfff {
				i += 6
				continue
			}
		}
		return fmt.Errorf(`\u%04X is a lone surrogate`, r)
	}
	return nil
}

// hex4 reads the four hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[:4]), 16, 32)
	return rune(n), err == nil
}

// number is a JSON number, kept exactly: two numbers are equal when they
// have the same value however they are written.
type number struct {
	text   string // as written, which is what a reviewer is shown
	neg    bool
	digits string // significant digits, without leading or trailing zeros; "" for zero
	exp    int64  // the value is 0.digits × 10^exp
}

// parseNumber reads a number in JSON's syntax.
func parseNumber(s string) (number, error) {
	n := number{text: s}
	mant, e := s, int64(0)
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		// A narrower exponent keeps the arithmetic below from overflowing;
		// nothing outside a double's range of about 1e±308 is meaningful
		// in a schema anyway.
		v, err := strconv.ParseInt(s[i+1:], 10, 32)
		if err != nil {
			return number{}, fmt.Errorf("number %.40s: exponent out of range", s)
		}
		mant, e = s[:i], v
	}
	mant, n.neg = strings.CutPrefix(mant, "-")
	whole, frac, _ := strings.Cut(mant, ".")
	digits := whole + frac
	if whole == "" || strings.Trim(digits, "0123456789") != "" {
		return number{}, fmt.Errorf("malformed number %.40s", s)
	}
	sig := strings.TrimLeft(digits, "0")
	n.digits = strings.TrimRight(sig, "0")
	if n.digits == "" {
		n.neg = false
		return n, nil
	}
	n.exp = e + int64(len(whole)) - int64(len(digits)-len(sig))
	return n, nil
}

// cmpNumber returns -1, 0 or +1 as a is less than, equal to or greater
// than b.
func cmpNumber(a, b number) int {
	sa, sb := a.sign(), b.sign()
	if sa != sb || sa == 0 {
		return cmp.Compare(sa, sb)
	}
	// Both have the same sign and are written 0.digits × 10^exp with a
	// nonzero first digit, so the exponent orders them, then the digits.
	m := cmp.Compare(a.exp, b.exp)
	if m == 0 {
		m = strings.Compare(a.digits, b.digits)
	}
	return sa * m
}

func (n number) sign() int {
	switch {
	case n.digits == "":
		return 0
	case n.neg:
		return -1
	}
	return 1
}
