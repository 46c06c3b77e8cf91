package tooldiff

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the diff sections of testdata/diffs/*.txt from Compare")

// A golden case is a file of testdata/diffs: a comment, then sections each
// opened by a line "-- <name> --": old and new, the two definitions (an
// empty section meaning none), and diff, Compare's result as indented JSON.
type goldenCase struct {
	comment  string
	sections map[string]string
}

var sectionNames = []string{"old", "new", "diff"}

func readCase(t testing.TB, path string) goldenCase {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c := goldenCase{sections: map[string]string{}}
	name := "" // of the section being read; "" for the comment
	var text strings.Builder
	flush := func() {
		if name == "" {
			c.comment = text.String()
		} else {
			c.sections[name] = text.String()
		}
		text.Reset()
	}
	for line := range strings.Lines(string(data)) {
		header, opened := strings.CutPrefix(strings.TrimRight(line, "\n"), "-- ")
		header, closed := strings.CutSuffix(header, " --")
		if !opened || !closed {
			text.WriteString(line)
			continue
		}
		flush()
		if _, dup := c.sections[header]; dup {
			t.Fatalf("%s: section %s twice", path, header)
		}
		name = header
	}
	flush()
	for _, name := range sectionNames {
		if _, ok := c.sections[name]; !ok {
			t.Fatalf("%s: no %s section", path, name)
		}
	}
	return c
}

func (c goldenCase) format() []byte {
	var b bytes.Buffer
	b.WriteString(c.comment)
	for _, name := range sectionNames {
		b.WriteString("-- " + name + " --\n")
		b.WriteString(c.sections[name])
	}
	return b.Bytes()
}

// definition parses a section, nil when it is empty.
func definition(t testing.TB, section string) *Definition {
	t.Helper()
	if strings.TrimSpace(section) == "" {
		return nil
	}
	def, err := Parse([]byte(section))
	if err != nil {
		t.Fatal(err)
	}
	return def
}

func goldenFiles(t testing.TB) []string {
	files, err := filepath.Glob(filepath.Join("testdata", "diffs", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	return files
}

func encodeDiff(t testing.TB, d Diff) string {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(d); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestGolden(t *testing.T) {
	for _, path := range goldenFiles(t) {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			c := readCase(t, path)
			old, new := definition(t, c.sections["old"]), definition(t, c.sections["new"])
			checkPair(t, old, new)
			got := encodeDiff(t, Compare(old, new))
			if *update {
				c.sections["diff"] = got
				if err := os.WriteFile(path, c.format(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if got != c.sections["diff"] {
				t.Errorf("Compare =\n%s\nwant\n%s(go test ./tooldiff/ -run TestGolden -update rewrites it)", got, c.sections["diff"])
			}
		})
	}
}
