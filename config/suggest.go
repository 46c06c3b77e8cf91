package config

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
var unknownField = regexp.MustCompile(`line (\d+): field (\S+) not found in type config\.(\w+)`)

// explainDecode rewrites yaml's unknown-key errors in err for the operator:
// the key, where, the keys that section has, and the one meant if one is
// close, rather than a Go type's name.
func explainDecode(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	msgs := make([]string, len(te.Errors))
	for i, e := range te.Errors {
		msgs[i] = e
		m := unknownField.FindStringSubmatch(e)
		if m == nil {
			continue
		}
		keys := sectionKeys[m[3]]
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

// sectionKeys are the YAML keys of each section of the configuration, by
// its Go type's name.
var sectionKeys = func() map[string][]string {
	out := map[string][]string{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || t.PkgPath() != reflect.TypeFor[Config]().PkgPath() {
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
	walk(reflect.TypeFor[Config]())
	return out
}()
