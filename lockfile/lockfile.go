// Package lockfile is the approvals lockfile: a reviewable file that lists,
// for each (server_id, tool), the schema digest a person approved and the
// canonical definition that digest covers.
//
// The catalog tells capsnap what a server serves now; the lockfile says what
// a person has reviewed. A policy that points at a lockfile admits into a
// snapshot only a tool whose live digest the lockfile approves, so a new or
// redefined tool waits for review instead of being trusted because a server
// published it. `capsnap lock` writes the file from the live servers and
// `capsnap lock --check` reports, for CI, how the live tools have drifted
// from it.
//
// The file is JSON because the definitions are JSON. It is written
// deterministically (entries sorted by server_id then tool, two-space
// indentation, a trailing newline), so that regenerating it from the same
// tools gives the same bytes and a review is a plain diff. Each definition is
// stored in its canonical (RFC 8785) form, re-indented for reading; the
// digest is over the canonical form, so the indentation does not matter.
//
//	{
//	  "version": 1,
//	  "tools": [
//	    {
//	      "server_id": "billing",
//	      "tool": "refund",
//	      "digest": "sha256:…",
//	      "definition": {
//	        "description": "Refund part or all of an order, in USD.",
//	        …
//	      }
//	    }
//	  ]
//	}
package lockfile

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"unicode/utf8"

	"github.com/gowebpki/jcs"

	"github.com/capsnap/capsnap/mcpparse"
)

// Version is the only format version this package reads and writes.
const Version = 1

// Entry approves one tool of one server at one digest.
type Entry struct {
	ServerID string `json:"server_id"`
	Tool     string `json:"tool"`
	// Digest is mcpparse.ToolDigest of Definition.
	Digest string `json:"digest"`
	// Definition is the tool's governing definition. Entries from Load
	// carry the canonical form; Marshal accepts any form of it and stores
	// the canonical one.
	Definition json.RawMessage `json:"definition"`
}

// Lock is a loaded and verified lockfile. It is immutable.
type Lock struct {
	entries  []Entry
	approved map[key]string
}

// key is a struct of strings rather than one joined string, so that a
// lookup builds no string and allocates nothing.
type key struct{ server, tool string }

// file is the document as it is written.
type file struct {
	Version int     `json:"version"`
	Tools   []Entry `json:"tools"`
}

// Load reads and verifies a lockfile. It is strict, because a reviewer reads
// the file and capsnap acts on it, and the two must read the same thing: an
// unknown or repeated member, a version other than 1, an entry listed twice,
// a definition that is not one tool's governing fields alone, or a digest
// that is not the digest of its definition is an error that names the entry.
func Load(path string) (*Lock, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load lockfile: %w", err)
	}
	return ParseFile(path, data)
}

// ParseFile is Load of data, the bytes read from path.
func ParseFile(path string, data []byte) (*Lock, error) {
	l, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("load lockfile %s: %w", path, err)
	}
	return l, nil
}

func parse(data []byte) (*Lock, error) {
	// encoding/json would quietly replace invalid UTF-8 with U+FFFD.
	if !utf8.Valid(data) {
		return nil, errors.New("not valid UTF-8")
	}
	var (
		version     int
		haveVersion bool
		tools       []json.RawMessage
		haveTools   bool
	)
	err := members(data, func(name string, v json.RawMessage) error {
		switch name {
		case "version":
			haveVersion = true
			if err := json.Unmarshal(v, &version); err != nil {
				return fmt.Errorf("version: %s is not an integer", v)
			}
		case "tools":
			haveTools = true
			if v[0] != '[' {
				return errors.New(`"tools" is not an array`)
			}
			return json.Unmarshal(v, &tools)
		default:
			return fmt.Errorf("unknown member %q", name)
		}
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case !haveVersion:
		return nil, errors.New(`no "version"`)
	case version != Version:
		return nil, fmt.Errorf("version %d is not supported (want %d)", version, Version)
	case !haveTools:
		return nil, errors.New(`no "tools"`)
	}

	l := &Lock{entries: make([]Entry, 0, len(tools)), approved: make(map[key]string, len(tools))}
	index := make(map[key]int, len(tools))
	for i, raw := range tools {
		e, err := parseEntry(raw)
		if err != nil {
			return nil, fmt.Errorf("tools[%d]%s: %w", i, e.label(), err)
		}
		k := key{e.ServerID, e.Tool}
		if j, dup := index[k]; dup {
			return nil, fmt.Errorf("tools[%d]%s: listed twice (also tools[%d])", i, e.label(), j)
		}
		index[k] = i
		l.approved[k] = e.Digest
		l.entries = append(l.entries, e)
	}
	sortEntries(l.entries)
	return l, nil
}

// parseEntry reads one entry and verifies it. On error the entry holds
// whatever names it has been read, for the message.
func parseEntry(raw json.RawMessage) (Entry, error) {
	var e Entry
	err := members(raw, func(name string, v json.RawMessage) error {
		var dst *string
		switch name {
		case "server_id":
			dst = &e.ServerID
		case "tool":
			dst = &e.Tool
		case "digest":
			dst = &e.Digest
		case "definition":
			e.Definition = v
			return nil
		default:
			return fmt.Errorf("unknown member %q", name)
		}
		if v[0] != '"' {
			return fmt.Errorf("%s is not a string", name)
		}
		return json.Unmarshal(v, dst)
	})
	if err != nil {
		return e, err
	}
	canonical, err := e.verify()
	if err != nil {
		return e, err
	}
	// The definition must be the governing fields and nothing else: a
	// member the digest does not cover would show the reviewer text that
	// was never approved.
	if c, err := jcs.Transform(e.Definition); err != nil || !bytes.Equal(c, canonical) {
		return e, errors.New("definition has members that the digest does not cover (only name, title, description, inputSchema, outputSchema and annotations belong in it)")
	}
	e.Definition = canonical
	return e, nil
}

// verify checks that an entry is complete and that its digest and name are
// those of its definition, and returns the canonical definition.
func (e Entry) verify() (canonical []byte, err error) {
	switch {
	case e.ServerID == "":
		return nil, errors.New("no server_id")
	case e.Tool == "":
		return nil, errors.New("no tool")
	case len(e.Definition) == 0:
		return nil, errors.New("no definition")
	}
	digest, canonical, err := mcpparse.ToolDigest(e.Definition)
	if err != nil {
		return nil, fmt.Errorf("definition: %w", err)
	}
	var def struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(canonical, &def); err != nil {
		return nil, fmt.Errorf("definition: %w", err)
	}
	if def.Name != e.Tool {
		return nil, fmt.Errorf("the definition is of tool %q", def.Name)
	}
	if digest != e.Digest {
		return nil, fmt.Errorf("digest %q is not the digest of the definition, %s", e.Digest, digest)
	}
	return canonical, nil
}

// label names an entry in messages, with a leading space, or is empty when
// the entry has no name yet.
func (e Entry) label() string {
	if e.ServerID == "" && e.Tool == "" {
		return ""
	}
	return " " + e.ServerID + "/" + e.Tool
}

// members calls fn for each member of the JSON object data, in order. It
// refuses a name that appears twice and data after the object: encoding/json
// would take the last of two "definition" members, while a reviewer may
// well read the first. Names are matched exactly, not up to letter case.
func members(data []byte, fn func(name string, value json.RawMessage) error) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	malformed := func(err error) error {
		return fmt.Errorf("malformed JSON near byte %d: %w", dec.InputOffset(), err)
	}
	tok, err := dec.Token()
	if err != nil {
		return malformed(err)
	}
	if tok != json.Delim('{') {
		return errors.New("not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return malformed(err)
		}
		name := tok.(string)
		if seen[name] {
			return fmt.Errorf("member %q appears twice", name)
		}
		seen[name] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return malformed(err)
		}
		if err := fn(name, v); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return malformed(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the object")
	}
	return nil
}

// Approved reports whether the lockfile approves this tool of this server at
// this digest. It is a map lookup and allocates nothing, for the decision's
// hot path.
func (l *Lock) Approved(serverID, tool, digest string) bool {
	d, ok := l.approved[key{serverID, tool}]
	return ok && d == digest
}

// Entries returns the approved tools, sorted by server_id then tool, with
// canonical definitions. The slice is the caller's; the definitions are
// shared and must not be modified.
func (l *Lock) Entries() []Entry { return slices.Clone(l.entries) }

// Marshal returns the lockfile of entries, in any order: the same entries
// always give the same bytes. Each entry is verified as Load verifies it, so
// that what is written always loads, and its definition is stored in
// canonical form without the members its digest does not cover.
func Marshal(entries []Entry) ([]byte, error) {
	f := file{Version: Version, Tools: make([]Entry, 0, len(entries))}
	seen := make(map[key]bool, len(entries))
	for _, e := range entries {
		canonical, err := e.verify()
		if err != nil {
			return nil, fmt.Errorf("marshal lockfile: tool%s: %w", e.label(), err)
		}
		k := key{e.ServerID, e.Tool}
		if seen[k] {
			return nil, fmt.Errorf("marshal lockfile: tool%s: listed twice", e.label())
		}
		seen[k] = true
		e.Definition = canonical
		f.Tools = append(f.Tools, e)
	}
	sortEntries(f.Tools)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// Definitions are for people to read: "<" stays "<", not "\u003c".
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(f); err != nil {
		return nil, fmt.Errorf("marshal lockfile: %w", err)
	}
	return buf.Bytes(), nil
}

// Write writes the lockfile of entries to path atomically: to a temporary
// file in the same directory, then renamed over path, so that a reader (or
// an interrupted write) never sees half a file.
func Write(path string, entries []Entry) error {
	data, err := Marshal(entries)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write lockfile: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename, there is nothing to remove
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write lockfile: %w", err)
	}
	// CreateTemp makes the file private; a lockfile is meant to be read
	// and checked in.
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("write lockfile: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write lockfile: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write lockfile: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write lockfile: %w", err)
	}
	return nil
}

func sortEntries(entries []Entry) {
	slices.SortFunc(entries, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.ServerID, b.ServerID), cmp.Compare(a.Tool, b.Tool))
	})
}
