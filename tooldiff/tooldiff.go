// Package tooldiff computes what changed between the approved definition of
// an MCP tool and the definition its server lists now.
//
// When a server changes a tool, capsnap holds the changed tool for a
// person's review. Compare names each kind of change (a property added, a
// bound widened, the description reworded, a hint flipped) and where it
// is, so that a policy can accept some kinds of change on its own, say a
// tool whose only change is its title, and a reviewer sees a readable diff
// rather than two blobs of JSON.
//
// Equality is semantic: member order, whitespace, escapes and the spelling
// of numbers (1e2 and 100) are not changes, nor is the order of the values
// of enum, required and type, nor a schema true against {}, nor an absent
// items, additionalProperties, properties, required or annotations against
// the value it defaults to.
// Anything else that differs is reported, under a specific Kind where one
// describes it and otherwise under InputSchemaChanged, OutputSchemaChanged
// or OtherChanged.
//
// A Change's Field is a dotted path from the top of the definition:
// "description", "annotations.readOnlyHint", "inputSchema.properties.amount",
// "inputSchema.properties.amount.maximum", or, for the items of an array
// property named items, "inputSchema.properties.items.items.properties.sku".
// A member name made of anything but letters, digits, '_', '-' and '$' is
// written as a Go-quoted string in brackets: inputSchema.properties["a.b"].
//
// The schema kinds mean the same in inputSchema and outputSchema; the Field
// says which. A widened input lets the model send more; a widened output
// lets the server return more.
package tooldiff

import (
	"cmp"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// Kind is a kind of change.
type Kind string

// The kinds of change. Unless its comment says otherwise, a Change's From
// and To are the old and new values at its Field, absent where the member
// is absent.
const (
	// ToolAdded: there was no old definition. Field is "" and To is the
	// new definition.
	ToolAdded Kind = "tool_added"
	// ToolRemoved: there is no new definition. Field is "" and From is the
	// old definition.
	ToolRemoved Kind = "tool_removed"
	// TitleChanged: the tool's title or the title in its annotations, both
	// display names, changed. Words holds the word-by-word edit. (A
	// schema's title, which the model reads, is InputSchemaChanged or
	// OutputSchemaChanged.)
	TitleChanged Kind = "title_changed"
	// DescriptionChanged: the tool's description or a schema's description
	// changed. Words holds the word-by-word edit.
	DescriptionChanged Kind = "description_changed"
	// InputSchemaChanged: part of the input schema changed in a way no
	// other kind describes ($ref, oneOf, a default, a schema deeper than
	// Compare follows), or the input schema was added or removed. Field is
	// the keyword, or the schema where Compare stopped.
	InputSchemaChanged Kind = "input_schema_changed"
	// OutputSchemaChanged is InputSchemaChanged for the output schema.
	OutputSchemaChanged Kind = "output_schema_changed"
	// OutputSchemaAdded: the tool gained an output schema.
	OutputSchemaAdded Kind = "output_schema_added"
	// OutputSchemaRemoved: the tool lost its output schema.
	OutputSchemaRemoved Kind = "output_schema_removed"
	// PropertyAdded: an object schema gained a property. Field is the
	// property and To its schema.
	PropertyAdded Kind = "property_added"
	// PropertyRemoved: an object schema lost a property. Field is the
	// property and From its schema.
	PropertyRemoved Kind = "property_removed"
	// PropertyRetyped: a schema's type keyword differs. Field is the
	// schema (the property, not its type keyword); From and To are the
	// types.
	PropertyRetyped Kind = "property_retyped"
	// MadeRequired: a name joined an object schema's required list.
	// Field is the property, whether or not the schema defines it; From
	// and To are absent.
	MadeRequired Kind = "made_required"
	// MadeOptional: a name left an object schema's required list. Field
	// is the property; From and To are absent.
	MadeOptional Kind = "made_optional"
	// EnumWidened: the enum allows values it did not, or was dropped.
	// From lists the values only the old enum holds and To those only the
	// new one holds, an absent enum holding none.
	EnumWidened Kind = "enum_widened"
	// EnumNarrowed: the enum no longer allows some values, or was added.
	// From and To are as for EnumWidened; a change both adds and removes
	// values is reported as both kinds.
	EnumNarrowed Kind = "enum_narrowed"
	// BoundWidened: a bound (minimum, maximum, exclusiveMinimum,
	// exclusiveMaximum, minLength, maxLength, minItems, maxItems,
	// minProperties, maxProperties) was lowered if a lower bound or raised
	// if an upper one, or a bound or a pattern was removed. Field is the
	// keyword.
	BoundWidened Kind = "bound_widened"
	// BoundNarrowed is the reverse of BoundWidened, including a bound or a
	// pattern added.
	BoundNarrowed Kind = "bound_narrowed"
	// PatternChanged: a pattern was replaced by another, which Compare
	// cannot call wider or narrower.
	PatternChanged Kind = "pattern_changed"
	// AdditionalPropertiesOpened: additionalProperties was false and now
	// is not (true, a schema, or absent).
	AdditionalPropertiesOpened Kind = "additional_properties_opened"
	// AdditionalPropertiesClosed: additionalProperties is now false.
	AdditionalPropertiesClosed Kind = "additional_properties_closed"
	// AnnotationChanged: a member of annotations (a hint such as
	// readOnlyHint) was flipped, added or removed. Field is
	// "annotations.<name>".
	AnnotationChanged Kind = "annotation_changed"
	// OtherChanged: a top-level member no other kind covers (the name,
	// _meta, icons, ...) changed. Field is the member.
	OtherChanged Kind = "other_changed"
)

// Diff is what changed from one definition of a tool to another.
type Diff struct {
	// Changes are sorted by Field, then Kind. Compare never leaves them
	// nil, so that a Diff with no changes encodes as [].
	Changes []Change `json:"changes"`
}

// Change is one change, at one place in the definition.
type Change struct {
	Kind Kind `json:"kind"`
	// Field is where the change is; see the package comment.
	Field string `json:"field"`
	// From and To are JSON; what they hold depends on Kind.
	From json.RawMessage `json:"from,omitempty"`
	To   json.RawMessage `json:"to,omitempty"`
	// Words is the word-by-word edit of a changed title or description.
	Words []Word `json:"words,omitempty"`
}

// Kinds returns the distinct kinds of change in d, sorted.
func (d Diff) Kinds() []Kind {
	kinds := make([]Kind, 0, len(d.Changes))
	for _, c := range d.Changes {
		kinds = append(kinds, c.Kind)
	}
	slices.Sort(kinds)
	return slices.Compact(kinds)
}

// Fields returns the distinct fields that changed in d, sorted.
func (d Diff) Fields() []string {
	fields := make([]string, 0, len(d.Changes))
	for _, c := range d.Changes {
		fields = append(fields, c.Field)
	}
	slices.Sort(fields)
	return slices.Compact(fields)
}

// Empty reports whether d holds no change.
func (d Diff) Empty() bool { return len(d.Changes) == 0 }

// Compare returns what changed from old to new. A nil old means the tool
// was added, a nil new that it was removed. Both must come from Parse.
func Compare(old, new *Definition) Diff {
	switch {
	case old == nil && new == nil:
		return Diff{Changes: []Change{}}
	case old == nil:
		return Diff{Changes: []Change{{Kind: ToolAdded, To: encode(new.members)}}}
	case new == nil:
		return Diff{Changes: []Change{{Kind: ToolRemoved, From: encode(old.members)}}}
	}
	d := differ{changes: []Change{}}
	for _, k := range unionKeys(old.members, new.members) {
		a, b := old.members[k], new.members[k]
		if equal(a, b) {
			continue
		}
		switch k {
		case "title":
			d.text(TitleChanged, OtherChanged, k, a, b)
		case "description":
			d.text(DescriptionChanged, OtherChanged, k, a, b)
		case "inputSchema":
			d.unexplained = InputSchemaChanged
			if a == nil || b == nil {
				d.add(InputSchemaChanged, k, a, b)
			} else {
				d.schema(k, a, b, 0)
			}
		case "outputSchema":
			d.unexplained = OutputSchemaChanged
			switch {
			case a == nil:
				d.add(OutputSchemaAdded, k, a, b)
			case b == nil:
				d.add(OutputSchemaRemoved, k, a, b)
			default:
				d.schema(k, a, b, 0)
			}
		case "annotations":
			d.annotations(a, b)
		default:
			d.add(OtherChanged, join("", k), a, b)
		}
	}
	slices.SortFunc(d.changes, func(a, b Change) int {
		return cmp.Or(strings.Compare(a.Field, b.Field), strings.Compare(string(a.Kind), string(b.Kind)))
	})
	return Diff{Changes: d.changes}
}

// differ collects the changes of one Compare.
type differ struct {
	changes []Change
	// unexplained is the kind for a change to the schema being compared
	// that no specific kind describes.
	unexplained Kind
}

// add records a change; from and to are values of the decoded tree, nil
// where absent. It returns the change for the caller to complete.
func (d *differ) add(kind Kind, field string, from, to any) *Change {
	d.changes = append(d.changes, Change{Kind: kind, Field: field, From: encode(from), To: encode(to)})
	return &d.changes[len(d.changes)-1]
}

// text records a change to a title or description, falling back to the
// kind otherwise when either side is not a string.
func (d *differ) text(kind, otherwise Kind, field string, a, b any) {
	as, aok := a.(string)
	bs, bok := b.(string)
	if (a != nil && !aok) || (b != nil && !bok) {
		d.add(otherwise, field, a, b)
		return
	}
	d.add(kind, field, a, b).Words = wordDiff(as, bs)
}

func (d *differ) annotations(a, b any) {
	am, aok := objectOf(a)
	bm, bok := objectOf(b)
	if !aok || !bok {
		d.add(AnnotationChanged, "annotations", a, b)
		return
	}
	for _, k := range unionKeys(am, bm) {
		av, bv := am[k], bm[k]
		if equal(av, bv) {
			continue
		}
		// The annotations' title is a display name like the tool's own,
		// so a policy that accepts a new title accepts it too.
		if field := join("annotations", k); k == "title" {
			d.text(TitleChanged, AnnotationChanged, field, av, bv)
		} else {
			d.add(AnnotationChanged, field, av, bv)
		}
	}
}

// join appends the member name to the path, quoting a name that could
// otherwise be read as more than one step of a path.
func join(path, name string) string {
	plain := name != ""
	for _, r := range name {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_' && r != '-' && r != '$' {
			plain = false
			break
		}
	}
	switch {
	case !plain:
		return path + "[" + strconv.Quote(name) + "]"
	case path == "":
		return name
	}
	return path + "." + name
}
