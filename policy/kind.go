package policy

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/deny"
)

// A Kind is one kind of rule a tool rule, and perhaps a grant, may carry
// under one key of the policy file: constraints, budgets, after. All the
// policy does with a kind lives with it, in a file of its own: decoding and
// validating what the operator wrote (Compile), what a call must satisfy
// (Applied.Terms), its part of the decision digest (Rules.Digested), how a
// new policy's rules of the kind are looser than the old one's
// (Applied.Looser), explaining itself (Applied.Explain) and the arguments
// it reads (Rules.Reads). Compile, Loosenings, Explain and Lint loop over
// the kinds, and none of them names one.
//
// A kind joins the policy by calling register from its file's init. So
// adding a kind is adding a file (and, for a new denial, a row of deny's
// table): schedule.go is the worked example.
type Kind interface {
	// Key is the key its rules are written under.
	Key() string
	// Stage places its terms among other kinds' in Decision.Terms, lowest
	// first: a term that only reads the call before one that records it
	// (Term.Records), and among those, one that can give back what it took
	// before one that cannot.
	Stage() int
	// OnGrant reports whether a grant may carry it too, not only a tool
	// rule.
	OnGrant() bool
	// Compile decodes (with Site.Decode) and validates what is written
	// under the key at s; value is nil when nothing is. An error names the
	// field.
	Compile(s *Site, value *yaml.Node) (Rules, error)
	// Apply is what the kind's rules on a tool rule and on the grant that
	// decides a call to it (nil when the kind is not on grants) say about
	// that call. It is never nil.
	Apply(tool, grant Rules) Applied
}

// Rules are what one tool rule or grant says in one kind, compiled.
type Rules interface {
	// Digested is their part of the digest of every decision they apply
	// to, under the kind's key; nil leaves the key out, so that a policy
	// that does not use the kind keeps the digests it had before the kind
	// existed. Its JSON names are part of every pinned digest.
	Digested() any
	// Reads are the expressions over the call they evaluate, for Lint and
	// LintArguments.
	Reads() []Reading
}

// Applied is what one kind's rules say about the calls to one tool under
// one grant: part of a Decision.
type Applied interface {
	// Terms are what a call must satisfy, in order.
	Terms() []Term
	// Looser lists, for people, how next (the same kind's, for the same
	// call under a new policy) is looser: a call it would allow that these
	// rules deny, or on looser terms.
	Looser(next Applied) []string
	// Explain says the rules to a person, evaluated on call (as far as
	// they can be without the store) unless call.Args is nil.
	Explain(call Call) Explanation
}

// Explanation is what one kind's rules say about a call, for Explain.
type Explanation struct {
	// Lines say each rule and what it makes of the call.
	Lines []string
	// Denials are the rules that deny the call on its own, whatever any
	// counter or log holds.
	Denials []Denial
	// Unless is what the call needs beyond itself to be allowed, said as
	// "allowed, if ..." continues (e.g. "its budgets have room"); "" if
	// nothing.
	Unless string
	// Otherwise are the reasons the rules may yet deny the call for, on
	// what Explain could not evaluate: what the store holds, when Unless
	// is set (budget_exhausted for a budget without room), and the
	// arguments, when none were given (constraint_violation). Verdict
	// holds the decision core to them.
	Otherwise []deny.Reason
	// Decides names, when the call has no arguments to evaluate, the rules
	// that decide each call on its arguments (e.g. "constraints"); "" if
	// none do.
	Decides string
}

// Denial is a rule that denies a call, and why, for Explain.
type Denial struct {
	Rule   string
	Reason deny.Reason
}

// Reading is an expression of a rule that reads the call's arguments.
type Reading struct {
	// Field is the expression's field in the file.
	Field string
	expr  *expression
	// Guard, formatted with an argument's name, says how to write the
	// expression so that a call without the argument passes.
	Guard string
}

// termsOf is ts as Terms.
func termsOf[T Term](ts []T) []Term {
	out := make([]Term, len(ts))
	for i, t := range ts {
		out[i] = t
	}
	return out
}

// kinds are the kinds register was given, by Stage.
var kinds []Kind

// register adds k to the kinds every policy compiles. Kinds call it from
// init, so a duplicate key is a programming error.
func register(k Kind) {
	for _, o := range kinds {
		if o.Key() == k.Key() {
			panic("policy: kind " + k.Key() + " registered twice")
		}
	}
	kinds = append(kinds, k)
	slices.SortStableFunc(kinds, func(a, b Kind) int { return a.Stage() - b.Stage() })
}

// kindIndex is the position of the kind of key in kinds, -1 for none.
func kindIndex(key string) int {
	return slices.IndexFunc(kinds, func(k Kind) bool { return k.Key() == key })
}

// A Site is where rules are written: a tool rule, or a grant.
type Site struct {
	// Field is the site's path in the file: tools[2] or
	// principals[0].grants[1].
	Field string
	// Server is the site's server, and Tool the tool of a tool rule.
	Server, Tool string
	// Grant is set for a grant.
	Grant bool

	// counters are the budgets and rate limits of the site by name, and
	// shared those of every grant of its principal rule.
	counters map[string]string
	shared   map[string]*counter
}

// At is the path of key under the site.
func (s *Site) At(key string) string { return s.Field + "." + key }

// Decode decodes value into v strictly: a key v has no field for is an
// error naming the field where it is, because a rule that loads with a
// typo in it says something the operator did not mean. A nil value leaves
// v alone.
func (s *Site) Decode(key string, value *yaml.Node, v any) error {
	if value == nil {
		return nil
	}
	field := s.At(key)
	if err := knownKeys(field, value, reflect.TypeOf(v).Elem()); err != nil {
		return err
	}
	if err := value.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	return nil
}

// knownKeys refuses a mapping key in n that t (where n is decoded into)
// has no yaml field for, at any depth.
func knownKeys(field string, n *yaml.Node, t reflect.Type) error {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case n.Kind == yaml.SequenceNode && t.Kind() == reflect.Slice:
		for i, item := range n.Content {
			if err := knownKeys(fmt.Sprintf("%s[%d]", field, i), item, t.Elem()); err != nil {
				return err
			}
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, value := n.Content[i].Value, n.Content[i+1]
			if key == "<<" {
				if err := knownKeys(field, value, t); err != nil {
					return err
				}
				continue
			}
			ft, ok := fields[key]
			if !ok {
				return fmt.Errorf("%s: field %s not found (want %s)", field, key, strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
			}
			if err := knownKeys(field+"."+key, value, ft); err != nil {
				return err
			}
		}
	}
	return nil
}

// yamlFields are the keys yaml decodes into the struct t, with their types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case !f.IsExported() || name == "-" || strings.Contains(opts, "inline"):
			continue
		case name == "":
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}

// compileRules compiles what the site says in each kind that may be
// written there, in kinds' order, and refuses a key no kind has.
func compileRules(s *Site, written map[string]yaml.Node) ([]Rules, error) {
	for _, key := range slices.Sorted(maps.Keys(written)) {
		i := kindIndex(key)
		if i < 0 || (s.Grant && !kinds[i].OnGrant()) {
			return nil, fmt.Errorf("%s: field %s not found (want %s)", s.Field, key, strings.Join(siteKeys(s.Grant), ", "))
		}
	}
	s.counters = map[string]string{}
	out := make([]Rules, len(kinds))
	for i, k := range kinds {
		if s.Grant && !k.OnGrant() {
			continue
		}
		var value *yaml.Node
		if n, ok := written[k.Key()]; ok {
			value = &n
		}
		r, err := k.Compile(s, value)
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

// siteKeys are the keys a tool rule, or a grant, may have.
func siteKeys(grant bool) []string {
	t := reflect.TypeFor[ToolRule]()
	if grant {
		t = reflect.TypeFor[Grant]()
	}
	var out []string
	for name := range yamlFields(t) {
		out = append(out, name)
	}
	for _, k := range kinds {
		if !grant || k.OnGrant() {
			out = append(out, k.Key())
		}
	}
	slices.Sort(out)
	return out
}
