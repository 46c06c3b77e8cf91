package tooldiff

import (
	"cmp"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func FuzzCompare(f *testing.F) {
	for _, path := range goldenFiles(f) {
		c := readCase(f, path)
		f.Add([]byte(c.sections["old"]), []byte(c.sections["new"]))
	}
	// Bare schemas, which fuzzDefinition wraps.
	f.Add([]byte(`{"type":"object","properties":{"a":{"type":"string","maxLength":3}},"required":["a"]}`),
		[]byte(`{"type":"object","properties":{"a":{"type":["string","null"],"minLength":1}},"additionalProperties":false}`))
	f.Add([]byte(`{"items":{"enum":[1,"x",null,{"a":[]}]}}`), []byte(`{"items":{"enum":[1.0,"y",{"a":[]}]}}`))
	f.Add([]byte(`true`), []byte(`false`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		checkPair(t, fuzzDefinition(t, a), fuzzDefinition(t, b))
	})
}

// fuzzDefinition parses raw as a definition or, failing that, as the input
// schema of one, so that the fuzzer can mutate bare schemas; nil when raw is
// neither.
func fuzzDefinition(t *testing.T, raw []byte) *Definition {
	t.Helper()
	parse := func(raw []byte) *Definition {
		def, err := Parse(raw)
		if (def == nil) == (err == nil) {
			t.Fatalf("Parse(%q) = %v, %v: want a definition or an error", raw, def, err)
		}
		return def
	}
	if def := parse(raw); def != nil {
		return def
	}
	return parse(slices.Concat([]byte(`{"name":"t","inputSchema":`), raw, []byte(`}`)))
}

// mirrors pairs the kinds that swap when old and new do; every other kind
// reads the same both ways.
var mirrors = map[Kind]Kind{
	ToolAdded:                  ToolRemoved,
	OutputSchemaAdded:          OutputSchemaRemoved,
	PropertyAdded:              PropertyRemoved,
	MadeRequired:               MadeOptional,
	EnumWidened:                EnumNarrowed,
	BoundWidened:               BoundNarrowed,
	AdditionalPropertiesOpened: AdditionalPropertiesClosed,
}

func mirror(k Kind) Kind {
	for a, b := range mirrors {
		switch k {
		case a:
			return b
		case b:
			return a
		}
	}
	return k
}

// checkPair checks what must hold of Compare for any two definitions.
func checkPair(t *testing.T, a, b *Definition) {
	t.Helper()
	for _, d := range []*Definition{a, b} {
		if same := Compare(d, d); !same.Empty() {
			t.Fatalf("Compare(d, d) = %s, want no change", encodeDiff(t, same))
		}
	}
	ab, ba := Compare(a, b), Compare(b, a)
	checkDiff(t, ab)
	checkDiff(t, ba)
	if again := Compare(a, b); !reflect.DeepEqual(again, ab) {
		t.Fatalf("Compare differs from one call to the next:\n%s\n%s", encodeDiff(t, ab), encodeDiff(t, again))
	}
	// Swapping old and new mirrors each change and swaps From and To; the
	// word-by-word edits need not mirror, as an edit has many equal forms.
	want := make([]Change, len(ab.Changes))
	for i, c := range ab.Changes {
		want[i] = Change{Kind: mirror(c.Kind), Field: c.Field, From: c.To, To: c.From}
	}
	slices.SortFunc(want, byPlace)
	got := make([]Change, len(ba.Changes))
	for i, c := range ba.Changes {
		got[i] = Change{Kind: c.Kind, Field: c.Field, From: c.From, To: c.To}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Compare(new, old) =\n%s\nwant the mirror of Compare(old, new) =\n%s", encodeDiff(t, Diff{got}), encodeDiff(t, ab))
	}
}

func byPlace(a, b Change) int {
	return cmp.Or(strings.Compare(a.Field, b.Field), strings.Compare(string(a.Kind), string(b.Kind)))
}

// checkDiff checks what must hold of any Diff that Compare returns.
func checkDiff(t *testing.T, d Diff) {
	t.Helper()
	if d.Changes == nil {
		t.Fatal("Changes is nil")
	}
	for i, c := range d.Changes {
		if i > 0 && byPlace(d.Changes[i-1], c) >= 0 {
			t.Fatalf("changes %d and %d out of order or at one place: %+v, %+v", i-1, i, d.Changes[i-1], c)
		}
		for _, v := range []json.RawMessage{c.From, c.To} {
			if v != nil && !json.Valid(v) {
				t.Fatalf("%s at %s: %q is not JSON", c.Kind, c.Field, v)
			}
		}
		if c.Kind == TitleChanged || c.Kind == DescriptionChanged {
			checkWords(t, c)
		} else if c.Words != nil {
			t.Fatalf("%s at %s has words", c.Kind, c.Field)
		}
	}
	if _, err := json.Marshal(d); err != nil {
		t.Fatal(err)
	}
}

// checkWords checks that a text change's Words spell out its From and To.
func checkWords(t *testing.T, c Change) {
	t.Helper()
	text := func(v json.RawMessage) string {
		var s string
		if v != nil {
			if err := json.Unmarshal(v, &s); err != nil {
				t.Fatalf("%s at %s: %v", c.Kind, c.Field, err)
			}
		}
		return strings.Join(strings.Fields(s), " ")
	}
	var from, to []string
	for i, w := range c.Words {
		if w.Text == "" || (i > 0 && c.Words[i-1].Op == w.Op) {
			t.Fatalf("%s at %s: words %+v: empty or unmerged", c.Kind, c.Field, c.Words)
		}
		switch w.Op {
		case "=":
			from, to = append(from, w.Text), append(to, w.Text)
		case "-":
			from = append(from, w.Text)
		case "+":
			to = append(to, w.Text)
		default:
			t.Fatalf("%s at %s: op %q", c.Kind, c.Field, w.Op)
		}
	}
	if strings.Join(from, " ") != text(c.From) || strings.Join(to, " ") != text(c.To) {
		t.Fatalf("%s at %s: words %+v do not spell %s -> %s", c.Kind, c.Field, c.Words, c.From, c.To)
	}
}
