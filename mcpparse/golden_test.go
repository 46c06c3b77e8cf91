package mcpparse

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/deny"
)

var update = flag.Bool("update", false, "rewrite the generated golden files under testdata")

// requestCase is one row of testdata/requests/*.json: a POST as Envoy
// hands it over, and what Parse must make of it.
type requestCase struct {
	Name    string            `json:"name"`
	Headers map[string]string `json:"headers"`
	// Body is the body's exact text when it is a JSON string, and the
	// body itself (as written in the file) otherwise.
	Body json.RawMessage `json:"body"`
	// Want is the parse of an accepted request; Reason and Detail (a
	// substring) describe the denial of a refused one.
	Want   *parsed     `json:"want,omitempty"`
	Reason deny.Reason `json:"reason,omitempty"`
	Detail string      `json:"detail,omitempty"`
}

type parsed struct {
	Version  Version         `json:"version"`
	Batch    bool            `json:"batch,omitempty"`
	Session  string          `json:"session,omitempty"`
	Messages []parsedMessage `json:"messages"`
}

type parsedMessage struct {
	Kind   string          `json:"kind"`
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Tool   string          `json:"tool,omitempty"`
	// Arguments is compared after compaction.
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

func (c requestCase) body(t *testing.T) []byte {
	if len(c.Body) > 0 && c.Body[0] == '"' {
		var s string
		if err := json.Unmarshal(c.Body, &s); err != nil {
			t.Fatalf("%s: body: %v", c.Name, err)
		}
		return []byte(s)
	}
	return c.Body
}

func summarize(r *Request) *parsed {
	p := &parsed{Version: r.Version, Batch: r.Batch, Session: r.Session}
	for _, m := range r.Messages {
		pm := parsedMessage{Kind: m.Kind.String(), ID: m.ID, Method: m.Method, Tool: m.Tool}
		if m.Arguments != nil {
			var b bytes.Buffer
			if err := json.Compact(&b, m.Arguments); err != nil {
				panic(err)
			}
			pm.Arguments = b.Bytes()
		}
		p.Messages = append(p.Messages, pm)
	}
	return p
}

func TestGoldenRequests(t *testing.T) {
	files, err := filepath.Glob("testdata/requests/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden request files: %v", err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var cases []requestCase
		if err := json.Unmarshal(data, &cases); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, c := range cases {
			t.Run(filepath.Base(file)+"/"+c.Name, func(t *testing.T) {
				if (c.Want == nil) == (c.Reason == "") {
					t.Fatalf("case needs exactly one of want and reason")
				}
				r, err := Parse(c.body(t), c.Headers, Limits{})
				if c.Reason != "" {
					d, ok := deny.As(err)
					if !ok || d.Reason != c.Reason || !strings.Contains(d.Detail, c.Detail) {
						t.Fatalf("Parse = %v, %v\nwant reason %s with detail containing %q", r, err, c.Reason, c.Detail)
					}
					return
				}
				if err != nil {
					t.Fatalf("Parse = %v", err)
				}
				got, _ := json.Marshal(summarize(r))
				want, _ := json.Marshal(c.Want)
				if !bytes.Equal(got, want) {
					t.Errorf("parse\n got %s\nwant %s", got, want)
				}
			})
		}
	}
}

func writeGolden(t *testing.T, file string, v any) {
	t.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, append(data, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}
