package envoy_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/envoy"
)

// checkCase is a file of testdata/check: a bootstrap of this directory,
// edited at the paths a Finding names, held to a capsnap configuration,
// and the findings that must come of it, in order.
type checkCase struct {
	// Bootstrap is demo.yaml, jwt.yaml or mtls.yaml; Capsnap the
	// configuration file, from this directory.
	Bootstrap string `yaml:"bootstrap"`
	Capsnap   string `yaml:"capsnap"`
	Edits     []struct {
		At     string `yaml:"at"`
		Set    any    `yaml:"set"`
		Delete bool   `yaml:"delete"`
	} `yaml:"edits"`
	Want []envoy.Finding `yaml:"want"`
}

func readCase(t *testing.T, file string) checkCase {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var tc checkCase
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&tc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return tc
}

// bootstrapOf is tc's bootstrap with its edits made.
func bootstrapOf(t *testing.T, tc checkCase) []byte {
	t.Helper()
	b, err := os.ReadFile(tc.Bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	if len(tc.Edits) == 0 {
		return b
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, e := range tc.Edits {
		s, err := steps(e.At)
		if err != nil {
			t.Fatalf("edit at %s: %v", e.At, err)
		}
		if doc, err = setAt(doc, s, e.Set, e.Delete); err != nil {
			t.Fatalf("edit at %s: %v", e.At, err)
		}
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Each file of testdata/check: the shipped bootstraps pass against the
// capsnap configurations they ship with, and each broken one gives its
// findings, where each is, what it says and whether it fails check.
func TestCheck(t *testing.T) {
	files, err := filepath.Glob("testdata/check/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no cases: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			tc := readCase(t, file)
			cfg, err := config.Load(tc.Capsnap)
			if err != nil {
				t.Fatal(err)
			}
			got, err := envoy.Check(bootstrapOf(t, tc), cfg.Envoy())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.Want) {
				out, _ := yaml.Marshal(got)
				t.Errorf("findings:\n%s\nwant %d:\n%v", out, len(tc.Want), tc.Want)
			}
			for _, f := range got {
				if _, err := steps(f.Path); err != nil {
					t.Errorf("path %s: %v", f.Path, err)
				}
			}
		})
	}
}

// The shipped bootstraps each have their case, unedited and clean.
func TestCheckCoversShippedConfigs(t *testing.T) {
	for _, name := range []string{"demo", "jwt", "mtls"} {
		tc := readCase(t, filepath.Join("testdata", "check", name+".yaml"))
		if tc.Bootstrap != name+".yaml" || len(tc.Edits) != 0 || len(tc.Want) != 0 {
			t.Errorf("testdata/check/%s.yaml: %s with %d edits, %d findings; want %s.yaml as shipped, clean", name, tc.Bootstrap, len(tc.Edits), len(tc.Want), name)
		}
	}
}

func TestCheckRefusesWhatIsNotYAML(t *testing.T) {
	if _, err := envoy.Check([]byte("static_resources: ["), envoy.Expect{}); err == nil {
		t.Fatal("no error")
	}
}

// FuzzCheck feeds Check what an operator might: any bytes, said to be a
// bootstrap. It must not panic, and every finding must say where and
// what.
func FuzzCheck(f *testing.F) {
	for _, b := range [][]byte{envoy.Demo, envoy.JWT, envoy.MTLS} {
		f.Add(b)
	}
	var wants []envoy.Expect
	for _, name := range []string{"capsnap-demo.yaml", "capsnap-mtls.yaml", filepath.Join("..", "examples", "jwt", "capsnap.yaml")} {
		if !strings.Contains(name, "/") {
			name = filepath.Join("testdata", name)
		}
		cfg, err := config.Load(name)
		if err != nil {
			f.Fatal(err)
		}
		wants = append(wants, cfg.Envoy())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, w := range wants {
			got, err := envoy.Check(b, w)
			if err != nil {
				return
			}
			for _, x := range got {
				if x.Message == "" {
					t.Errorf("%s: no message", x.Path)
				}
				if _, err := steps(x.Path); err != nil {
					t.Errorf("path %q: %v", x.Path, err)
				}
			}
		}
	})
}

// steps parses a Finding's path: keys, [N] indices and ["quoted"] keys.
func steps(p string) ([]any, error) {
	var out []any
	for p != "" {
		switch {
		case strings.HasPrefix(p, `["`):
			q, err := strconv.QuotedPrefix(p[1:])
			if err != nil || !strings.HasPrefix(p[1+len(q):], "]") {
				return nil, fmt.Errorf("bad quoted key at %s", p)
			}
			k, _ := strconv.Unquote(q)
			out, p = append(out, k), p[len(q)+2:]
		case p[0] == '[':
			end := strings.IndexByte(p, ']')
			n, err := strconv.Atoi(p[1:max(end, 1)])
			if end < 0 || err != nil || n < 0 {
				return nil, fmt.Errorf("bad index at %s", p)
			}
			out, p = append(out, n), p[end+1:]
		case p[0] == '.' && len(out) > 0:
			p = p[1:]
			if p == "" || p[0] == '.' || p[0] == '[' {
				return nil, fmt.Errorf("empty key at .%s", p)
			}
		default:
			end := strings.IndexAny(p, ".[")
			if end < 0 {
				end = len(p)
			}
			if end == 0 {
				return nil, fmt.Errorf("empty key at %s", p)
			}
			out, p = append(out, p[:end]), p[end:]
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty path")
	}
	return out, nil
}

// setAt sets the value at steps s of v to set, or deletes it; a mapping on
// the way that is not there is made, and an index one past a list's end
// appends to it.
func setAt(v any, s []any, set any, del bool) (any, error) {
	if len(s) == 0 {
		return set, nil
	}
	switch k := s[0].(type) {
	case string:
		m, ok := v.(map[string]any)
		if !ok && v != nil {
			return nil, fmt.Errorf("%s: not in a mapping", k)
		}
		if m == nil {
			m = map[string]any{}
		}
		if len(s) == 1 && del {
			delete(m, k)
			return m, nil
		}
		nv, err := setAt(m[k], s[1:], set, del)
		m[k] = nv
		return m, err
	default:
		i := k.(int)
		l, _ := v.([]any)
		if i > len(l) {
			return nil, fmt.Errorf("[%d]: past the end of %d", i, len(l))
		}
		if len(s) == 1 && del {
			return slices.Delete(l, i, i+1), nil
		}
		if i == len(l) {
			l = append(l, nil)
		}
		nv, err := setAt(l[i], s[1:], set, del)
		l[i] = nv
		return l, err
	}
}
