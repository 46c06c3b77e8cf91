package main

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestParseModeTools(t *testing.T) {
	o, err := parseMode("json,tools=225")
	if err != nil || !o.json || o.tools != 225 {
		t.Fatalf("%+v, %v", o, err)
	}
	for _, bad := range []string{"tools=0", "tools=-1", "tools=x", "tools=100001"} {
		if _, err := parseMode(bad); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
	if o, err := parseMode("json,pages=2"); err != nil || o.tools != 0 {
		t.Fatalf("%+v, %v", o, err)
	}
}

// The generated tools are distinct, named in order, realistic in size, and
// the same every time.
func TestGeneratedTools(t *testing.T) {
	tools := generatedTools(225)
	if len(tools) != 225 || tools[0].Name != "tool_001" || tools[224].Name != "tool_225" {
		t.Fatalf("%d tools, %s to %s", len(tools), tools[0].Name, tools[len(tools)-1].Name)
	}
	seen := map[string]bool{}
	total := 0
	for _, tl := range tools {
		b, err := json.Marshal(tl)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 200 || len(b) > 400 {
			t.Errorf("%s is %d bytes, want 200 to 400: %s", tl.Name, len(b), b)
		}
		if seen[string(b[len(`{"name":"tool_001"`):])] {
			t.Errorf("%s has another tool's definition", tl.Name)
		}
		seen[string(b[len(`{"name":"tool_001"`):])] = true
		total += len(b)
		props := tl.InputSchema.(map[string]any)["properties"].(map[string]any)
		if n := len(props); n < 2 || n > 4 {
			t.Errorf("%s has %d properties", tl.Name, n)
		}
	}
	t.Logf("225 tools, %d bytes, %d on average", total, total/225)
	if !reflect.DeepEqual(tools, generatedTools(225)) {
		t.Fatal("not deterministic")
	}
	if got := generatedTools(1000)[999].Name; got != "tool_1000" {
		t.Fatalf("the 1000th is %s", got)
	}
}

func TestFixtureServesGeneratedOnly(t *testing.T) {
	f := newFixture("", options{tools: 12})
	if len(f.tools) != 12 || len(f.stats().HandlerStarts) != 12 {
		t.Fatalf("%d tools, stats of %d", len(f.tools), len(f.stats().HandlerStarts))
	}
	if len(newFixture("", options{}).stats().HandlerStarts) != 6 {
		t.Fatal("the default fixture lost its six tools")
	}
}
