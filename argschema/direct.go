package argschema

import (
	"encoding/json"
	"unicode/utf8"
)

// node is the direct check of one schema object.
type node struct {
	// types is the allowed JSON types; zero allows any.
	types    jsonType
	props    map[string]*node
	required []string
	// closed is additionalProperties: false.
	closed bool
	// enum holds enum's values, or const's one value, as scalars:
	// string, bool, nil or decimal.
	enum     []any
	hasEnum  bool
	min, max *decimal
	// exclusiveMin and exclusiveMax mark min and max as exclusive
	// bounds; a schema with both forms of one bound has no direct check.
	exclusiveMin, exclusiveMax bool
	minLength, maxLength       int
	items                      *node
	minItems, maxItems         int
}

type jsonType uint8

const (
	typeNull jsonType = 1 << iota
	typeBoolean
	typeObject
	typeArray
	typeNumber
	typeInteger
	typeString
)

var typeNames = map[string]jsonType{
	"null": typeNull, "boolean": typeBoolean, "object": typeObject, "array": typeArray,
	"number": typeNumber, "integer": typeInteger, "string": typeString,
}

// annotations are the keywords that never affect validation.
var annotations = map[string]bool{
	"title": true, "description": true, "default": true, "examples": true,
	"$comment": true, "deprecated": true, "readOnly": true, "writeOnly": true,
}

const draft2020 = "https://json-schema.org/draft/2020-12/schema"

// compileNode returns the direct check of schema, or nil if it uses a
// keyword or a form the direct check does not implement: $ref, the
// combinators, pattern, format (which other drafts assert) and the rest
// are the engine's alone.
func compileNode(schema any, root bool) *node {
	if schema == true {
		return &node{minLength: -1, maxLength: -1, minItems: -1, maxItems: -1}
	}
	m, ok := schema.(map[string]any)
	if !ok {
		return nil
	}
	n := &node{minLength: -1, maxLength: -1, minItems: -1, maxItems: -1}
	for k, v := range m {
		if annotations[k] {
			continue
		}
		if !n.set(k, v, root) {
			return nil
		}
	}
	return n
}

// set applies one keyword, and reports whether the direct check
// implements it in that form.
func (n *node) set(k string, v any, root bool) bool {
	switch k {
	case "$schema":
		return root && v == draft2020
	case "type":
		return n.setTypes(v)
	case "properties":
		props, ok := v.(map[string]any)
		if !ok {
			return false
		}
		n.props = make(map[string]*node, len(props))
		for name, sub := range props {
			if n.props[name] = compileNode(sub, false); n.props[name] == nil {
				return false
			}
		}
		return true
	case "required":
		names, ok := v.([]any)
		for _, name := range names {
			s, isString := name.(string)
			if !isString {
				return false
			}
			n.required = append(n.required, s)
		}
		return ok
	case "additionalProperties":
		open, ok := v.(bool)
		n.closed = !open
		return ok
	case "enum":
		values, ok := v.([]any)
		n.hasEnum = true
		for _, x := range values {
			s, isScalar := scalar(x)
			if !isScalar {
				return false
			}
			n.enum = append(n.enum, s)
		}
		return ok
	case "const":
		s, ok := scalar(v)
		n.hasEnum, n.enum = true, []any{s}
		return ok
	case "minimum", "exclusiveMinimum":
		return n.setBound(&n.min, &n.exclusiveMin, v, k == "exclusiveMinimum")
	case "maximum", "exclusiveMaximum":
		return n.setBound(&n.max, &n.exclusiveMax, v, k == "exclusiveMaximum")
	case "minLength":
		return setCount(&n.minLength, v)
	case "maxLength":
		return setCount(&n.maxLength, v)
	case "minItems":
		return setCount(&n.minItems, v)
	case "maxItems":
		return setCount(&n.maxItems, v)
	case "items":
		n.items = compileNode(v, false)
		return n.items != nil
	}
	return false
}

func (n *node) setTypes(v any) bool {
	names := []any{v}
	if list, ok := v.([]any); ok {
		names = list
	}
	for _, name := range names {
		s, _ := name.(string)
		t, ok := typeNames[s]
		if !ok {
			return false
		}
		n.types |= t
	}
	return n.types != 0
}

func (n *node) setBound(bound **decimal, exclusive *bool, v any, isExclusive bool) bool {
	num, ok := v.(json.Number)
	if !ok || *bound != nil {
		return false
	}
	d, ok := parseDecimal(string(num))
	*bound, *exclusive = &d, isExclusive
	return ok
}

func setCount(dst *int, v any) bool {
	num, ok := v.(json.Number)
	if !ok {
		return false
	}
	d, ok := parseDecimal(string(num))
	if !ok || d.neg || !d.integer() || d.exp > 9 {
		return false
	}
	c := 0
	for i := range d.exp {
		c *= 10
		if i < d.hi-d.lo {
			c += int(d.at(d.lo+i) - '0')
		}
	}
	*dst = c
	return true
}

// scalar returns an enum or const value in the form accepts compares.
func scalar(v any) (any, bool) {
	switch v := v.(type) {
	case string, bool, nil:
		return v, true
	case json.Number:
		d, ok := parseDecimal(string(v))
		return d, ok
	}
	return nil, false
}

// accepts reports whether v certainly satisfies the schema. false means
// only that the engine must decide.
func (n *node) accepts(v any) bool {
	var num decimal
	t := typeOf(v)
	if t == 0 {
		return false
	}
	if t&typeNumber != 0 {
		var ok bool
		if num, ok = parseDecimal(string(v.(json.Number))); !ok {
			return false
		}
		if num.integer() {
			t |= typeInteger
		}
	}
	if n.types != 0 && n.types&t == 0 {
		return false
	}
	if n.hasEnum && !n.inEnum(v, &num) {
		return false
	}
	switch v := v.(type) {
	case map[string]any:
		return n.acceptsObject(v)
	case []any:
		return n.acceptsArray(v)
	case string:
		if n.minLength >= 0 || n.maxLength >= 0 {
			c := utf8.RuneCountInString(v)
			return c >= n.minLength && (n.maxLength < 0 || c <= n.maxLength)
		}
	case json.Number:
		return n.inBounds(&num)
	}
	return true
}

func typeOf(v any) jsonType {
	switch v.(type) {
	case nil:
		return typeNull
	case bool:
		return typeBoolean
	case map[string]any:
		return typeObject
	case []any:
		return typeArray
	case json.Number:
		return typeNumber
	case string:
		return typeString
	}
	return 0
}

func (n *node) inEnum(v any, num *decimal) bool {
	for _, e := range n.enum {
		switch e := e.(type) {
		case decimal:
			if _, isNum := v.(json.Number); isNum && num.cmp(&e) == 0 {
				return true
			}
		default:
			if typeOf(v)&(typeNull|typeBoolean|typeString) != 0 && v == e {
				return true
			}
		}
	}
	return false
}

func (n *node) acceptsObject(v map[string]any) bool {
	for _, r := range n.required {
		if _, ok := v[r]; !ok {
			return false
		}
	}
	for k, x := range v {
		p, ok := n.props[k]
		if !ok {
			if n.closed {
				return false
			}
			continue
		}
		if !p.accepts(x) {
			return false
		}
	}
	return true
}

func (n *node) acceptsArray(v []any) bool {
	if len(v) < n.minItems || (n.maxItems >= 0 && len(v) > n.maxItems) {
		return false
	}
	if n.items != nil {
		for _, x := range v {
			if !n.items.accepts(x) {
				return false
			}
		}
	}
	return true
}

func (n *node) inBounds(d *decimal) bool {
	if n.min != nil {
		c := d.cmp(n.min)
		if c < 0 || (c == 0 && n.exclusiveMin) {
			return false
		}
	}
	if n.max != nil {
		c := d.cmp(n.max)
		if c > 0 || (c == 0 && n.exclusiveMax) {
			return false
		}
	}
	return true
}
