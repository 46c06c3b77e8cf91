package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/mcpparse"
)

// script is a source that publishes exactly what the test hands it, and
// says when the catalog has taken it.
type script struct {
	fetches chan fetch
	taken   chan struct{}
}

type fetch struct {
	defs []json.RawMessage
	err  error
}

func (s script) Run(ctx context.Context, publish Publish) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case f := <-s.fetches:
			publish(f.defs, f.err)
			s.taken <- struct{}{}
		}
	}
}

func def(name, description string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"name":%q,"description":%q,"inputSchema":{"type":"object"}}`, name, description))
}

func digest(t *testing.T, def json.RawMessage) string {
	t.Helper()
	d, _, err := mcpparse.ToolDigest(def)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestCatalogGenerations(t *testing.T) {
	a1, a2, b1 := def("a", "first"), def("a", "second"), def("b", "first")
	steps := []struct {
		name string
		fetch
		wantErr     string // substring of Status.LastError; "" for none
		wantGen     uint64
		wantChanged []string // nil: no OnChange
		wantTools   []string
	}{
		{name: "first list", fetch: fetch{defs: []json.RawMessage{a1, b1}},
			wantGen: 1, wantChanged: []string{"a", "b"}, wantTools: []string{"a", "b"}},
		{name: "same tools in another order and other _meta", fetch: fetch{defs: []json.RawMessage{
			json.RawMessage(`{"_meta":{"build":"2"}, "inputSchema":{"type":"object"}, "description":"first", "name":"b"}`), a1}},
			wantGen: 1, wantTools: []string{"a", "b"}},
		{name: "one tool redefined", fetch: fetch{defs: []json.RawMessage{a2, b1}},
			wantGen: 2, wantChanged: []string{"a"}, wantTools: []string{"a", "b"}},
		{name: "fetch failed", fetch: fetch{err: errors.New("connection refused")},
			wantErr: "connection refused", wantGen: 2, wantTools: []string{"a", "b"}},
		{name: "a name listed twice", fetch: fetch{defs: []json.RawMessage{a2, b1, def("b", "other")}},
			wantErr: `tool "b" is listed twice`, wantGen: 2, wantTools: []string{"a", "b"}},
		{name: "a definition that is not strict JSON", fetch: fetch{defs: []json.RawMessage{json.RawMessage(`{"name":"a","name":"b"}`)}},
			wantErr: "tool 0", wantGen: 2, wantTools: []string{"a", "b"}},
		{name: "changed back", fetch: fetch{defs: []json.RawMessage{a1, b1}},
			wantGen: 3, wantChanged: []string{"a"}, wantTools: []string{"a", "b"}},
		{name: "tool removed", fetch: fetch{defs: []json.RawMessage{b1}},
			wantGen: 4, wantChanged: []string{"a"}, wantTools: []string{"b"}},
		{name: "every tool removed", fetch: fetch{defs: nil},
			wantGen: 5, wantChanged: []string{"b"}, wantTools: []string{}},
	}

	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { now = now.Add(time.Second); return now }
	src := script{fetches: make(chan fetch), taken: make(chan struct{})}
	changes := make(chan change, 1)
	c := New(map[string]Source{"billing": src}, Options{
		Clock:    clock,
		OnChange: func(_ string, prev, next *List, changed []string) { changes <- change{prev, next, changed} },
	})
	if _, _, err := c.Lookup("billing"); !isUnavailable(err) {
		t.Fatalf("Lookup before any fetch: %v, want catalog_unavailable", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	var lastGood time.Time
	for _, step := range steps {
		src.fetches <- step.fetch
		<-src.taken
		list, st, err := c.Lookup("billing")
		if err != nil {
			t.Fatalf("%s: Lookup: %v", step.name, err)
		}
		if step.wantErr == "" && st.LastError != nil || step.wantErr != "" && (st.LastError == nil || !strings.Contains(st.LastError.Error(), step.wantErr)) {
			t.Errorf("%s: LastError %v, want %q", step.name, st.LastError, step.wantErr)
		}
		if !st.LastAttempt.Equal(now) {
			t.Errorf("%s: LastAttempt %v, want %v", step.name, st.LastAttempt, now)
		}
		select {
		case ch := <-changes:
			if step.wantChanged == nil {
				t.Errorf("%s: OnChange(%v), want no call", step.name, ch.changed)
			} else if !slices.Equal(ch.changed, step.wantChanged) {
				t.Errorf("%s: changed %v, want %v", step.name, ch.changed, step.wantChanged)
			}
			if ch.next != list {
				t.Errorf("%s: OnChange's next is not the list Lookup returns", step.name)
			}
			if step.wantGen == 1 && ch.prev != nil {
				t.Errorf("%s: first OnChange has prev %v, want nil", step.name, ch.prev)
			}
		default:
			if step.wantChanged != nil {
				t.Errorf("%s: no OnChange, want changed %v", step.name, step.wantChanged)
			}
		}
		if list.Generation != step.wantGen {
			t.Errorf("%s: generation %d, want %d", step.name, list.Generation, step.wantGen)
		}
		if got := slices.Sorted(maps.Keys(list.Tools)); !slices.Equal(got, step.wantTools) {
			t.Errorf("%s: tools %v, want %v", step.name, got, step.wantTools)
		}
		if step.wantErr == "" {
			lastGood = list.FetchedAt
		}
		if !list.FetchedAt.Equal(lastGood) || !st.FetchedAt.Equal(lastGood) || !st.Synced {
			t.Errorf("%s: list fetched at %v, status %+v, want both fetched at %v", step.name, list.FetchedAt, st, lastGood)
		}
	}
}

func TestToolFields(t *testing.T) {
	raw := json.RawMessage(`{"inputSchema": {"type":"object", "required":["order_id"]}, "name":"refund", "icons":[], "description":"Refund an order."}`)
	tools, err := parseTools([]json.RawMessage{raw})
	if err != nil {
		t.Fatal(err)
	}
	got := tools["refund"]
	want := Tool{
		Name:        "refund",
		Digest:      digest(t, raw),
		Definition:  json.RawMessage(`{"description":"Refund an order.","inputSchema":{"required":["order_id"],"type":"object"},"name":"refund"}`),
		InputSchema: json.RawMessage(`{"required":["order_id"],"type":"object"}`),
	}
	if got.Name != want.Name || got.Digest != want.Digest || string(got.Definition) != string(want.Definition) || string(got.InputSchema) != string(want.InputSchema) {
		t.Errorf("tool\n got %+v\nwant %+v", got, want)
	}
}

func TestLookupUnconfigured(t *testing.T) {
	c := New(map[string]Source{"b": script{}, "a": script{}}, Options{})
	if got := c.Servers(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Servers() = %v, want [a b]", got)
	}
	if _, _, err := c.Lookup("files"); !isUnavailable(err) {
		t.Errorf("Lookup(files) = %v, want catalog_unavailable", err)
	}
}

func TestRunStopsOnMisconfiguredSource(t *testing.T) {
	c := New(map[string]Source{
		"fine":   script{fetches: make(chan fetch)},
		"broken": &MCPSource{URL: "ftp://billing"},
	}, Options{})
	errc := make(chan error, 1)
	go func() { errc <- c.Run(context.Background()) }()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "broken") {
			t.Fatalf("Run: %v, want the broken source's error", err)
		}
	case <-time.After(wait):
		t.Fatal("Run kept running with a misconfigured source")
	}
	_, st, err := c.Lookup("broken")
	if !isUnavailable(err) || st.LastError == nil {
		t.Errorf("Lookup(broken) = %+v, %v; want catalog_unavailable with the error recorded", st, err)
	}
}

func isUnavailable(err error) bool {
	d, ok := deny.As(err)
	return ok && d.Reason == deny.CatalogUnavailable
}
