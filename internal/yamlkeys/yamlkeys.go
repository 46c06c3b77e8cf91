// Package yamlkeys says what yaml's strict decoding (KnownFields) refused
// in words a person acts on: the line, the unknown key, and the key meant
// when one is close (package spelling), or else the keys that section
// has, rather than a Go type's name. The configuration and capsnap policy
// test's files read their errors through it.
package yamlkeys

import (
	"errors"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/internal/spelling"
)

// unknownField is how yaml says a key has no field: "line 3: field
// polcy_poll_interval not found in type config.Config".
var unknownField = regexp.MustCompile(`line (\d+): field (\S+) not found in type \S+\.(\w+)`)

// Explain rewrites yaml's unknown-key errors in err, from decoding into
// root (a struct, or a slice or pointer of one): "line 1: unknown key
// polcy_poll_interval (did you mean policy_poll_interval?)". Any other
// error is returned as it is.
func Explain(err error, root reflect.Type) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	sections := sectionKeys(root)
	msgs := make([]string, len(te.Errors))
	for i, e := range te.Errors {
		msgs[i] = e
		m := unknownField.FindStringSubmatch(e)
		if m == nil {
			continue
		}
		keys := sections[m[3]]
		msg := "line " + m[1] + ": unknown key " + m[2]
		if best := spelling.Closest(m[2], keys); best != "" {
			msg += " (did you mean " + best + "?)"
		} else if len(keys) > 0 {
			msg += " (the keys here are " + strings.Join(keys, ", ") + ")"
		}
		msgs[i] = msg
	}
	return errors.New(strings.Join(msgs, "; "))
}

// sectionKeys are the YAML keys of each struct type reachable from root
// in root's own package, by the type's name.
func sectionKeys(root reflect.Type) map[string][]string {
	out := map[string][]string{}
	pkg := ""
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if pkg == "" {
			pkg = t.PkgPath()
		}
		if t.Kind() != reflect.Struct || t.PkgPath() != pkg {
			return
		}
		if _, seen := out[t.Name()]; seen {
			return
		}
		out[t.Name()] = nil
		var keys []string
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if !f.IsExported() || name == "-" || name == "" {
				continue
			}
			keys = append(keys, name)
			walk(f.Type)
		}
		slices.Sort(keys)
		out[t.Name()] = keys
	}
	walk(root)
	return out
}
