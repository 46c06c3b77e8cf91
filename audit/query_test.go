package audit

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSelect(t *testing.T) {
	at := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tt := range []struct {
		name string
		q    Query
		want []string // request ids
	}{
		{"everything", Query{}, []string{"r1", "r2", "r3", "r4"}},
		{"by principal", Query{Principal: "agent-b"}, []string{"r3", "r4"}},
		{"by server and tool", Query{Server: "billing", Tool: "refund"}, []string{"r2"}},
		{"by reason", Query{Reason: "no_snapshot"}, []string{"r4"}},
		{"denials", Query{Decision: "deny"}, []string{"r2", "r4"}},
		{"since, inclusive", Query{Since: at("2026-12-05T08:00:01.25Z")}, []string{"r2", "r3", "r4"}},
		{"until, exclusive", Query{Until: at("2026-12-05T08:00:03.5Z")}, []string{"r1", "r2"}},
		{"a window", Query{Since: at("2026-12-05T08:00:01Z"), Until: at("2026-12-05T08:00:04Z")}, []string{"r2", "r3"}},
		{"nothing", Query{Principal: "agent-c"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, err := os.Open("testdata/query.jsonl")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var out bytes.Buffer
			n, err := Select(f, &out, tt.q)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, line := range strings.SplitAfter(out.String(), "\n") {
				if line == "" {
					continue
				}
				var l struct {
					RequestID string `json:"request_id"`
				}
				if err := json.Unmarshal([]byte(line), &l); err != nil {
					t.Fatalf("output line %q: %v", line, err)
				}
				got = append(got, l.RequestID)
			}
			if !slices.Equal(got, tt.want) || n != len(tt.want) {
				t.Errorf("selected %v (n=%d), want %v", got, n, tt.want)
			}
		})
	}
}

// Selected lines are the trail's bytes, so that audit verify's hashes
// still hold for them; a line that is not JSON is named.
func TestSelectKeepsBytesAndNamesBadLines(t *testing.T) {
	line := `{"log":"audit","decision":"deny","reason":"x","time":"2026-12-05T08:00:00Z","message":"decision","detail":"a \u00e9 b"}` + "\n"
	var out bytes.Buffer
	if _, err := Select(strings.NewReader(line), &out, Query{}); err != nil || out.String() != line {
		t.Fatalf("Select = %q, %v; want the line unchanged", out.String(), err)
	}
	_, err := Select(strings.NewReader(line+"not json\n"), &out, Query{})
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("Select of a bad line = %v, want an error naming line 2", err)
	}
}

// Whatever the trail holds, Select writes only whole lines of it.
func FuzzSelect(f *testing.F) {
	data, err := os.ReadFile("testdata/query.jsonl")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data, "agent-a", "deny")
	f.Add([]byte("{\"log\":\"audit\",\"message\":\"decision\",\"time\":\"x\"}\n"), "", "")
	f.Fuzz(func(t *testing.T, trail []byte, principal, decision string) {
		var out bytes.Buffer
		n, _ := Select(bytes.NewReader(trail), &out, Query{Principal: principal, Decision: decision})
		lines := strings.SplitAfter(out.String(), "\n")
		if lines[len(lines)-1] != "" || len(lines)-1 != n {
			t.Fatalf("%d lines written, n=%d: %q", len(lines)-1, n, out.String())
		}
		for _, l := range lines[:n] {
			if !bytes.Contains(trail, []byte(strings.TrimSuffix(l, "\n"))) {
				t.Fatalf("wrote %q, which is not in the trail", l)
			}
		}
	})
}
