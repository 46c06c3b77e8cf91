package lockfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/mcpparse"
)

var update = flag.Bool("update", false, "rewrite testdata/good.lock from the test's entries")

// Definitions as servers publish them: key order, whitespace, a number
// spelled 1e2 and members the digest does not cover are all noise that the
// lockfile must not keep.
var definitions = map[string]string{
	"billing/refund": `{"name":"refund","description":"Refund part or all of an order, in USD.",
		"inputSchema":{"type":"object","properties":{"order_id":{"type":"string"},"amount":{"type":"number","maximum":1e2},
		"reason_code":{"type":"string"}},"required":["order_id","amount","reason_code"],"additionalProperties":false},
		"annotations":{"destructiveHint":true},"_meta":{"build":"7f3a"}}`,
	"billing/lookup_order": `{"title":"Look up an order","name":"lookup_order",
		"description":"Look an order up by id: <status> & total.",
		"inputSchema":{"type":"object","properties":{"order_id":{"type":"string"}},"required":["order_id"]},
		"icons":[{"src":"https://example.com/i.png"}]}`,
	"payments/charge": `{"name":"charge","description":"Charge a card.","inputSchema":{"type":"object","properties":{"amount":{"type":"number"}}}}`,
}

// entry builds the entry for definitions[id], with its digest.
func entry(t *testing.T, id string) Entry {
	t.Helper()
	def, ok := definitions[id]
	if !ok {
		t.Fatalf("no definition %s", id)
	}
	server, tool, _ := strings.Cut(id, "/")
	return entryOf(t, server, tool, def)
}

func entryOf(t *testing.T, server, tool, def string) Entry {
	t.Helper()
	digest, _, err := mcpparse.ToolDigest([]byte(def))
	if err != nil {
		t.Fatal(err)
	}
	return Entry{ServerID: server, Tool: tool, Digest: digest, Definition: json.RawMessage(def)}
}

func allEntries(t *testing.T) []Entry {
	return []Entry{entry(t, "payments/charge"), entry(t, "billing/refund"), entry(t, "billing/lookup_order")}
}

// Marshal gives the golden bytes for the same entries in any order, and
// what it writes loads back to the same bytes.
func TestMarshalGolden(t *testing.T) {
	golden := filepath.Join("testdata", "good.lock")
	entries := allEntries(t)
	got, err := Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Marshal differs from %s (run with -update to accept):\n%s", golden, got)
	}
	for _, order := range [][]int{{1, 2, 0}, {2, 1, 0}, {0, 2, 1}} {
		shuffled := []Entry{entries[order[0]], entries[order[1]], entries[order[2]]}
		again, err := Marshal(shuffled)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, want) {
			t.Errorf("order %v gave other bytes:\n%s", order, again)
		}
	}

	l, err := Load(golden)
	if err != nil {
		t.Fatal(err)
	}
	round, err := Marshal(l.Entries())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(round, want) {
		t.Errorf("Load then Marshal changed the bytes:\n%s", round)
	}
}

// The golden file shows what a reviewer gets: the canonical definition
// re-indented, without the members the digest does not cover, with "<" and
// "&" as they are and a trailing newline.
func TestMarshalForReading(t *testing.T) {
	got, err := Marshal(allEntries(t))
	if err != nil {
		t.Fatal(err)
	}
	s := string(got)
	for _, want := range []string{
		"{\n  \"version\": 1,\n  \"tools\": [\n    {\n      \"server_id\": \"billing\",\n      \"tool\": \"lookup_order\",",
		`"description": "Look an order up by id: <status> & total.",`,
		`"maximum": 100`,
		"\n        \"name\": \"refund\"\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("lockfile lacks %q:\n%s", want, s)
		}
	}
	for _, unwanted := range []string{"_meta", "icons", `\u003c`, "1e2"} {
		if strings.Contains(s, unwanted) {
			t.Errorf("lockfile has %q:\n%s", unwanted, s)
		}
	}
	if !strings.HasSuffix(s, "}\n") || strings.HasSuffix(s, "\n\n") {
		t.Errorf("lockfile does not end in exactly one newline: %q", s[len(s)-5:])
	}
	empty, err := Marshal(nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(empty) != "{\n  \"version\": 1,\n  \"tools\": []\n}\n" {
		t.Errorf("empty lockfile is %q", empty)
	}
}

func TestMarshalRefuses(t *testing.T) {
	refund := entry(t, "billing/refund")
	tests := []struct {
		name  string
		entry func(e *Entry)
		want  string
	}{
		{"wrong digest", func(e *Entry) { e.Digest = entry(t, "payments/charge").Digest }, "is not the digest of the definition"},
		{"other tool's definition", func(e *Entry) { e.Tool = "charge" }, `the definition is of tool "refund"`},
		{"no server", func(e *Entry) { e.ServerID = "" }, "no server_id"},
		{"no definition", func(e *Entry) { e.Definition = nil }, "no definition"},
		{"definition not strict", func(e *Entry) { e.Definition = json.RawMessage(`{"name":"refund","name":"refund"}`) }, "not strict JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := refund
			tt.entry(&e)
			_, err := Marshal([]Entry{entry(t, "payments/charge"), e})
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "marshal lockfile: ") {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
	if _, err := Marshal([]Entry{refund, refund}); err == nil || !strings.Contains(err.Error(), "billing/refund: listed twice") {
		t.Errorf("duplicate: err = %v", err)
	}
}

func TestLoad(t *testing.T) {
	tests := []struct {
		file string
		want string // substring of the error; "" for a good file
	}{
		{"good.lock", ""},
		{"empty.lock", ""},
		{"unknown_field.lock", `unknown member "sha"`},
		{"unknown_top_field.lock", `unknown member "generated_by"`},
		{"other_case_member.lock", `unknown member "Digest"`},
		{"duplicate_entry.lock", "tools[3] billing/refund: listed twice (also tools[1])"},
		{"duplicate_member.lock", `tools[0] billing/lookup_order: member "definition" appears twice`},
		{"wrong_version.lock", "version 2 is not supported (want 1)"},
		{"no_version.lock", `no "version"`},
		{"digest_mismatch.lock", "tools[1] billing/refund: digest \"sha256:"},
		{"name_mismatch.lock", `tools[0] billing/lookup_order: the definition is of tool "lookup_orders"`},
		{"uncovered_member.lock", "tools[2] payments/charge: definition has members that the digest does not cover"},
		{"malformed.lock", "malformed JSON near byte"},
		{"invalid_json.lock", "malformed JSON near byte 13: invalid character '}'"},
		{"trailing_data.lock", "data after the object"},
		{"tools_null.lock", `"tools" is not an array`},
		{"digest_not_string.lock", "tools[0] billing/lookup_order: digest is not a string"},
		{"not_an_object.lock", "not a JSON object"},
		{"invalid_utf8.lock", "not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", tt.file)
			l, err := Load(path)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range l.Entries() {
					if !l.Approved(e.ServerID, e.Tool, e.Digest) {
						t.Errorf("%s/%s is not approved at its own digest", e.ServerID, e.Tool)
					}
				}
				return
			}
			if err == nil {
				t.Fatalf("loaded; want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "load lockfile "+path+": ") {
				t.Errorf("err = %v\nwant one starting with the path and containing %q", err, tt.want)
			}
		})
	}
	if _, err := Load(filepath.Join("testdata", "nope.lock")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: err = %v", err)
	}
}

func TestApproved(t *testing.T) {
	l, err := Load(filepath.Join("testdata", "good.lock"))
	if err != nil {
		t.Fatal(err)
	}
	refund, charge := entry(t, "billing/refund"), entry(t, "payments/charge")
	tests := []struct {
		name                 string
		server, tool, digest string
		want                 bool
	}{
		{"approved", "billing", "refund", refund.Digest, true},
		{"other digest", "billing", "refund", charge.Digest, false},
		{"same name on another server", "payments", "refund", refund.Digest, false},
		{"unknown tool", "billing", "export_ledger", refund.Digest, false},
		{"empty digest", "billing", "refund", "", false},
	}
	for _, tt := range tests {
		if got := l.Approved(tt.server, tt.tool, tt.digest); got != tt.want {
			t.Errorf("%s: Approved(%s, %s, %s) = %v", tt.name, tt.server, tt.tool, tt.digest, got)
		}
	}
	if n := testing.AllocsPerRun(100, func() { l.Approved("billing", "refund", refund.Digest) }); n != 0 {
		t.Errorf("Approved allocates %v times", n)
	}
}

func TestEntriesAreSortedAndCanonical(t *testing.T) {
	l, err := Load(filepath.Join("testdata", "good.lock"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range l.Entries() {
		ids = append(ids, e.ServerID+"/"+e.Tool)
		_, canonical, err := mcpparse.ToolDigest(e.Definition)
		if err != nil || !bytes.Equal(canonical, e.Definition) {
			t.Errorf("%s: definition is not canonical: %s", e.Tool, e.Definition)
		}
	}
	if want := []string{"billing/lookup_order", "billing/refund", "payments/charge"}; !slices.Equal(ids, want) {
		t.Errorf("entries %v, want %v", ids, want)
	}
	// The caller may reorder its copy without touching the lock.
	es := l.Entries()
	es[0], es[1] = es[1], es[0]
	if l.Entries()[0].Tool != "lookup_order" {
		t.Error("Entries shares its slice")
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "capsnap.lock")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, allEntries(t)); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := Marshal(allEntries(t))
	if !bytes.Equal(got, want) {
		t.Errorf("wrote %q", got)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, %v; want 0644", fi.Mode(), err)
	}
	// A refused write leaves the old file, and no temporary file, behind.
	bad := entry(t, "billing/refund")
	bad.Digest = "sha256:00"
	if err := Write(path, []Entry{bad}); err == nil {
		t.Fatal("wrote an entry with a wrong digest")
	}
	if again, _ := os.ReadFile(path); !bytes.Equal(again, want) {
		t.Error("a refused write changed the file")
	}
	if err := Write(filepath.Join(dir, "missing", "capsnap.lock"), allEntries(t)); err == nil || !strings.HasPrefix(err.Error(), "write lockfile: ") {
		t.Errorf("write into a missing directory: err = %v", err)
	}
	if names, _ := os.ReadDir(dir); len(names) != 1 {
		t.Errorf("directory holds %v, want only capsnap.lock", names)
	}
}
