package yamlkeys

import (
	"bytes"
	"reflect"
	"testing"

	"go.yaml.in/yaml/v3"
)

type file struct {
	Name  string `yaml:"name"`
	Cases []item `yaml:"cases"`
}

type item struct {
	Tool      string `yaml:"tool"`
	Principal string `yaml:"principal"`
}

// An unknown key is said with its line and the key meant, at any depth,
// or with the keys of its section when none is close.
func TestExplain(t *testing.T) {
	tests := []struct{ doc, want string }{
		{"nmae: x\n", "line 1: unknown key nmae (did you mean name?)"},
		{"name: x\ncases:\n  - tool: a\n    principle: b\n", "line 4: unknown key principle (did you mean principal?)"},
		{"cases:\n  - server: a\n", "line 2: unknown key server (the keys here are principal, tool)"},
		{"name: [x]\n", "line 1: cannot unmarshal !!seq into string"},
	}
	for _, tt := range tests {
		dec := yaml.NewDecoder(bytes.NewReader([]byte(tt.doc)))
		dec.KnownFields(true)
		var f file
		err := Explain(dec.Decode(&f), reflect.TypeFor[file]())
		if err == nil || err.Error() != tt.want {
			t.Errorf("%q: %v, want %q", tt.doc, err, tt.want)
		}
	}
}
