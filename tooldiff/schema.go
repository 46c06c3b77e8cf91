package tooldiff

import (
	"slices"
	"strings"
)

// maxSchemaDepth bounds how many properties, items and additionalProperties
// Compare follows down from a tool's schema. A difference deeper down is
// reported whole, at the schema where Compare stopped.
const maxSchemaDepth = 32

// bounds holds the keywords that bound a value from below or above, each
// mapped to whether raising it widens what the schema allows.
var bounds = map[string]bool{
	"minimum": false, "exclusiveMinimum": false, "minLength": false, "minItems": false, "minProperties": false,
	"maximum": true, "exclusiveMaximum": true, "maxLength": true, "maxItems": true, "maxProperties": true,
}

// schema compares two schemas found at path, depth schemas down.
func (d *differ) schema(path string, a, b any, depth int) {
	if equal(a, b) {
		return
	}
	as, aok := schemaObject(a)
	bs, bok := schemaObject(b)
	if !aok || !bok || depth >= maxSchemaDepth {
		d.add(d.unexplained, path, a, b)
		return
	}
	for _, k := range unionKeys(as, bs) {
		av, bv := as[k], bs[k]
		if equal(av, bv) {
			continue
		}
		field := join(path, k)
		switch k {
		case "type":
			d.retype(path, av, bv)
		case "properties":
			d.properties(path, av, bv, depth)
		case "required":
			d.required(path, av, bv)
		case "items":
			// Absent items allow any item, as true does.
			d.schema(field, orTrue(av), orTrue(bv), depth+1)
		case "additionalProperties":
			d.additional(field, av, bv, depth)
		case "enum":
			d.enum(field, av, bv)
		case "pattern":
			d.pattern(field, av, bv)
		case "description":
			// A schema's description is text the model reads, as the
			// tool's is. So is a schema's title, which is why it is left
			// to the unexplained kind: a TitleChanged, which a policy may
			// accept on sight, is only ever a display name.
			d.text(DescriptionChanged, d.unexplained, field, av, bv)
		default:
			if upper, ok := bounds[k]; ok {
				d.bound(field, av, bv, upper)
			} else {
				d.add(d.unexplained, field, av, bv)
			}
		}
	}
}

// schemaObject returns a schema's keywords, reading true, which allows
// anything, as the empty schema that also does. false is not an object.
func schemaObject(v any) (map[string]any, bool) {
	switch v := v.(type) {
	case map[string]any:
		return v, true
	case bool:
		return nil, v
	}
	return nil, false
}

func orTrue(v any) any {
	if v == nil {
		return true
	}
	return v
}

func (d *differ) retype(path string, a, b any) {
	at, aok := typeSet(a)
	bt, bok := typeSet(b)
	if aok && bok && slices.Equal(at, bt) {
		return
	}
	d.add(PropertyRetyped, path, a, b)
}

// typeSet returns the types a type keyword names, sorted and without
// repeats, so that "string" equals ["string"] and order does not matter.
func typeSet(v any) ([]string, bool) {
	switch v := v.(type) {
	case nil:
		return nil, true
	case string:
		return []string{v}, true
	case []any:
		set, ok := stringSet(v)
		return set, ok
	}
	return nil, false
}

// stringSet returns the strings of an array, absent being empty, sorted and
// without repeats.
func stringSet(v any) ([]string, bool) {
	arr, ok := v.([]any)
	if !ok {
		return nil, v == nil
	}
	set := make([]string, 0, len(arr))
	for _, e := range arr {
		s, ok := e.(string)
		if !ok {
			return nil, false
		}
		set = append(set, s)
	}
	slices.Sort(set)
	return slices.Compact(set), true
}

func (d *differ) properties(path string, a, b any, depth int) {
	path = join(path, "properties")
	ap, aok := objectOf(a)
	bp, bok := objectOf(b)
	if !aok || !bok {
		d.add(d.unexplained, path, a, b)
		return
	}
	for _, name := range unionKeys(ap, bp) {
		av, bv := ap[name], bp[name]
		if equal(av, bv) {
			continue
		}
		field := join(path, name)
		switch {
		case av == nil:
			d.add(PropertyAdded, field, nil, bv)
		case bv == nil:
			d.add(PropertyRemoved, field, av, nil)
		default:
			d.schema(field, av, bv, depth+1)
		}
	}
}

func (d *differ) required(path string, a, b any) {
	ar, aok := stringSet(a)
	br, bok := stringSet(b)
	if !aok || !bok {
		d.add(d.unexplained, join(path, "required"), a, b)
		return
	}
	props := join(path, "properties")
	for _, name := range br {
		if _, found := slices.BinarySearch(ar, name); !found {
			d.add(MadeRequired, join(props, name), nil, nil)
		}
	}
	for _, name := range ar {
		if _, found := slices.BinarySearch(br, name); !found {
			d.add(MadeOptional, join(props, name), nil, nil)
		}
	}
}

func (d *differ) additional(field string, a, b any, depth int) {
	switch {
	case a == false:
		d.add(AdditionalPropertiesOpened, field, a, b)
	case b == false:
		d.add(AdditionalPropertiesClosed, field, a, b)
	default:
		// Absent additionalProperties allow any property, as true does.
		d.schema(field, orTrue(a), orTrue(b), depth+1)
	}
}

func (d *differ) enum(field string, a, b any) {
	ae, aok := a.([]any)
	be, bok := b.([]any)
	switch {
	case (a != nil && !aok) || (b != nil && !bok):
		d.add(d.unexplained, field, a, b)
	case a == nil:
		d.add(EnumNarrowed, field, nil, b)
	case b == nil:
		d.add(EnumWidened, field, a, nil)
	default:
		if added := without(be, ae); len(added) > 0 {
			d.add(EnumWidened, field, nil, added)
		}
		if removed := without(ae, be); len(removed) > 0 {
			d.add(EnumNarrowed, field, removed, nil)
		}
	}
}

// without returns the values of a that b does not hold, in a's order; nil
// if there are none.
func without(a, b []any) []any {
	keys := make(map[string]bool, len(b))
	var sb strings.Builder
	for _, v := range b {
		sb.Reset()
		canon(&sb, v)
		keys[sb.String()] = true
	}
	var out []any
	for _, v := range a {
		sb.Reset()
		canon(&sb, v)
		if !keys[sb.String()] {
			out = append(out, v)
		}
	}
	return out
}

func (d *differ) bound(field string, a, b any, upper bool) {
	an, aok := a.(number)
	bn, bok := b.(number)
	switch {
	case a == nil:
		d.add(BoundNarrowed, field, a, b)
	case b == nil:
		d.add(BoundWidened, field, a, b)
	case !aok || !bok:
		d.add(d.unexplained, field, a, b)
	case (cmpNumber(an, bn) < 0) == upper:
		d.add(BoundWidened, field, a, b)
	default:
		d.add(BoundNarrowed, field, a, b)
	}
}

func (d *differ) pattern(field string, a, b any) {
	switch {
	case a == nil:
		d.add(BoundNarrowed, field, a, b)
	case b == nil:
		d.add(BoundWidened, field, a, b)
	default:
		d.add(PatternChanged, field, a, b)
	}
}
