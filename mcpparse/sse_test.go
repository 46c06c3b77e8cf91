package mcpparse

import (
	"strings"
	"testing"
)

// TestReadEventStream holds ReadEventStream to the HTML standard's
// event-stream interpretation on a complete body: each event's data as an
// EventSource client would deliver it, and its exact span in the body.
func TestReadEventStream(t *testing.T) {
	tests := []struct {
		name, body string
		// data is each event's data; spans each event's text, from its
		// first line through the blank line that dispatched it.
		data, spans []string
		// nData is each event's count of data lines.
		nData []int
		err   string
	}{
		{name: "empty body"},
		{name: "only blank lines", body: "\n\r\n\r\n"},
		{name: "one event", body: "data: x\n\n", data: []string{"x"}, spans: []string{"data: x\n\n"}, nData: []int{1}},
		{name: "no space after the colon", body: "data:x\n\n", data: []string{"x"}, spans: []string{"data:x\n\n"}, nData: []int{1}},
		{name: "only one space is dropped", body: "data:  x \n\n", data: []string{" x "}, spans: []string{"data:  x \n\n"}, nData: []int{1}},
		{name: "a tab is not dropped", body: "data:\tx\n\n", data: []string{"\tx"}, spans: []string{"data:\tx\n\n"}, nData: []int{1}},
		{name: "data field without a colon", body: "data\n\n", data: []string{""}, spans: []string{"data\n\n"}, nData: []int{1}},
		{name: "data lines join with LF", body: "data: a\ndata:\ndata: b\n\n", data: []string{"a\n\nb"}, spans: []string{"data: a\ndata:\ndata: b\n\n"}, nData: []int{3}},
		// The standard ignores other fields; clients read their names
		// differently (TypeScript drops a mis-decoded byte order mark,
		// Go trims space), so capsnap refuses every one.
		{name: "a field in another case", body: "Data: no\ndata: yes\n\n", err: `field "Data"`},
		{name: "a field with a space", body: "data : no\n\n", err: `field "data "`},
		{name: "a field after a mis-decoded byte order mark", body: "\u00ef\u00bb\u00bfdata: {}\n\n", err: "field"},
		{name: "an unknown field", body: "x-trace: 1\ndata: a\n\n", err: `field "x-trace"`},
		{name: "colon inside the value", body: "data: a: b\n\n", data: []string{"a: b"}, spans: []string{"data: a: b\n\n"}, nData: []int{1}},
		{
			name:  "other fields and comments carry no data",
			body:  ": hi\n\nid: 1\nevent: message\nretry: 10\ndata: d\n: c\n\nevent: e\n\n",
			data:  []string{"", "d", ""},
			spans: []string{": hi\n\n", "id: 1\nevent: message\nretry: 10\ndata: d\n: c\n\n", "event: e\n\n"},
			nData: []int{0, 1, 0},
		},
		{name: "leading blank lines", body: "\n\ndata: a\n\n", data: []string{"a"}, spans: []string{"data: a\n\n"}, nData: []int{1}},
		{name: "several blank lines between events", body: "data: a\n\n\n\ndata: b\n\n", data: []string{"a", "b"}, spans: []string{"data: a\n\n", "data: b\n\n"}, nData: []int{1, 1}},
		{name: "CRLF", body: "id: 1\r\ndata: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n", data: []string{"a\nb", "c"}, spans: []string{"id: 1\r\ndata: a\r\ndata: b\r\n\r\n", "data: c\r\n\r\n"}, nData: []int{2, 1}},
		// The standard ends a line at a lone CR too; the Go SDK's reader
		// does not, so capsnap refuses it rather than read other events.
		{name: "CR", body: "id: 1\rdata: a\rdata: b\r\rdata: c\r\r", err: "lone CR at byte 5"},
		{name: "mixed line endings", body: "data: a\r\ndata: b\n\ndata: c\r\n\r\n", data: []string{"a\nb", "c"}, spans: []string{"data: a\r\ndata: b\n\n", "data: c\r\n\r\n"}, nData: []int{2, 1}},
		{name: "lone CR inside a data line", body: "data: {\"id\":1,\r\"x\":2}\n\n", err: "lone CR at byte 14"},
		{name: "CR then LF is one line ending", body: "data: a\r\n\r\n", data: []string{"a"}, spans: []string{"data: a\r\n\r\n"}, nData: []int{1}},
		{name: "LF then CR is refused", body: "data: a\n\r", err: "lone CR"},
		{name: "NUL and invalid UTF-8 pass through", body: "data: \x00\xff\n\n", data: []string{"\x00\xff"}, spans: []string{"data: \x00\xff\n\n"}, nData: []int{1}},

		{name: "ends inside an event", body: "data: a\n", err: "ends inside an event"},
		{name: "ends inside an event without a line ending", body: "data: a", err: "ends inside an event"},
		{name: "ends inside a later event", body: "data: a\n\nid: 2\ndata: b\n", err: "ends inside an event"},
		{name: "ends inside a comment", body: "data: a\n\n: keepalive\n", err: "ends inside an event"},
		{name: "ends after a CR that is not a blank line", body: "data: a\r", err: "lone CR"},
		{name: "byte order mark", body: "\xef\xbb\xbfdata: a\n\n", err: "byte order mark"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events, err := ReadEventStream([]byte(tt.body))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ReadEventStream = %d events, %v; want an error containing %q", len(events), err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(events) != len(tt.data) {
				t.Fatalf("%d events, want %d", len(events), len(tt.data))
			}
			for i, e := range events {
				if string(e.Data) != tt.data[i] {
					t.Errorf("event %d data %q, want %q", i, e.Data, tt.data[i])
				}
				if got := tt.body[e.span.start:e.span.end]; got != tt.spans[i] {
					t.Errorf("event %d spans %q, want %q", i, got, tt.spans[i])
				}
				if len(e.lines) != tt.nData[i] {
					t.Errorf("event %d has %d data lines, want %d", i, len(e.lines), tt.nData[i])
				}
				for _, l := range e.lines {
					if line := tt.body[l.start:l.end]; !strings.HasPrefix(line, "data") {
						t.Errorf("event %d: data line %q", i, line)
					}
				}
			}
		})
	}
}

// TestReplaceData: the new data goes where the first data line was, one
// "data: " line per line; the event's other lines and the other events
// stay byte for byte.
func TestReplaceData(t *testing.T) {
	tests := []struct {
		name, body string
		event      int
		data, want string
	}{
		{
			name: "one line for one line", body: "data: a\n\nid: 2\ndata: b\n\ndata: c\n\n", event: 1, data: "B",
			want: "data: a\n\nid: 2\ndata: B\n\ndata: c\n\n",
		},
		{
			name: "several lines for one", body: "id: 1\nevent: message\ndata: x\n\n", event: 0, data: "{\n  \"a\": 1\n}",
			want: "id: 1\nevent: message\ndata: {\ndata:   \"a\": 1\ndata: }\n\n",
		},
		{
			name: "one line for several, other lines kept in order", body: ": c0\n\nid: 1\ndata: x\n: between\ndata:y\nevent: message\n\n: after\n\n", event: 1, data: "z",
			want: ": c0\n\nid: 1\ndata: z\n: between\nevent: message\n\n: after\n\n",
		},
		{
			name: "CRLF stream: only the data lines take LF", body: "data: p\r\n\r\nid: 7\r\ndata: x\r\ndata: y\r\n\r\n", event: 1, data: "q",
			want: "data: p\r\n\r\nid: 7\r\ndata: q\n\r\n",
		},
		{
			name: "empty data", body: "data: x\n\n", event: 0, data: "",
			want: "data: \n\n",
		},
		{
			name: "value with a leading space keeps it", body: "data: x\n\n", event: 0, data: " y",
			want: "data:  y\n\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events, err := ReadEventStream([]byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			got := ReplaceData([]byte(tt.body), events[tt.event], []byte(tt.data))
			if string(got) != tt.want {
				t.Fatalf("ReplaceData\n got %q\nwant %q", got, tt.want)
			}
			again, err := ReadEventStream(got)
			if err != nil {
				t.Fatalf("result does not read: %v", err)
			}
			if len(again) != len(events) {
				t.Fatalf("%d events, was %d", len(again), len(events))
			}
			for i := range events {
				want := string(events[i].Data)
				if i == tt.event {
					want = tt.data
				}
				if string(again[i].Data) != want {
					t.Errorf("event %d data %q, want %q", i, again[i].Data, want)
				}
			}
		})
	}
}
