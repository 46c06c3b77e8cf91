package mcpparse

import (
	"bytes"
	"fmt"
)

// Event is one dispatched event of a text/event-stream body.
type Event struct {
	// Data is the event's data: its data lines joined by "\n", as an
	// EventSource client delivers it.
	Data []byte
	// Type is its event field's value; empty means "message".
	Type string
	// span is the event in the body, from its first line through the blank
	// line that dispatched it; lines its data lines, in order.
	span  span
	lines []span
}

// ReadEventStream splits a complete text/event-stream body (as Envoy hands
// over a buffered response) into its events, the way the HTML standard's
// event-stream parser does: lines end at CRLF or LF (a lone CR, which the
// standard also allows, is refused: the Go SDK does not), a blank line
// dispatches an event, "data" fields join with "\n", comments and other
// fields carry no data. A body that ends inside an event is an error:
// clients differ on whether they dispatch it (the standard drops it, the
// Go SDK does not).
func ReadEventStream(body []byte) ([]Event, error) {
	if bytes.HasPrefix(body, []byte("\xef\xbb\xbf")) {
		return nil, fmt.Errorf("event stream starts with a byte order mark")
	}
	// The HTML standard ends a line at a lone CR too, the Go SDK's reader
	// only at LF: the two would see different events in one body.
	for i := bytes.IndexByte(body, '\r'); i >= 0; i = nextCR(body, i) {
		if i+1 == len(body) || body[i+1] != '\n' {
			return nil, fmt.Errorf("event stream has a line ending in a lone CR at byte %d, which clients split differently", i)
		}
	}
	var events []Event
	cur := Event{span: span{0, 0}}
	var data [][]byte
	open := false
	for pos := 0; pos < len(body); {
		end, next := lineEnd(body, pos)
		line := body[pos:end]
		if len(line) == 0 {
			if open {
				cur.span.end = next
				cur.Data = bytes.Join(data, []byte("\n"))
				events = append(events, cur)
			}
			cur, data, open = Event{span: span{next, next}}, nil, false
			pos = next
			continue
		}
		if !open {
			cur.span.start, open = pos, true
		}
		switch name, value := field(line); name {
		case "data":
			data = append(data, value)
			cur.lines = append(cur.lines, span{pos, next})
		case "event":
			cur.Type = string(value)
		case "", "id", "retry":
		default:
			// The standard ignores any other field, but clients do not
			// all read field names alike: TypeScript's parser drops the
			// characters of a mis-decoded byte order mark ("ï»¿data")
			// and Go's trims Unicode space. No MCP server sends another.
			return nil, fmt.Errorf("event stream has a field %s that MCP clients do not all read alike", excerpt(name))
		}
		pos = next
	}
	if open {
		return nil, fmt.Errorf("event stream ends inside an event (no blank line after it)")
	}
	return events, nil
}

func nextCR(b []byte, i int) int {
	j := bytes.IndexByte(b[i+1:], '\r')
	if j < 0 {
		return -1
	}
	return i + 1 + j
}

// lineEnd returns where the line starting at pos ends and where the next
// one starts.
func lineEnd(b []byte, pos int) (end, next int) {
	i := bytes.IndexAny(b[pos:], "\r\n")
	if i < 0 {
		return len(b), len(b)
	}
	end = pos + i
	if b[end] == '\r' && end+1 < len(b) && b[end+1] == '\n' {
		return end, end + 2
	}
	return end, end + 1
}

// field splits an event-stream line into its field name and value: the
// value follows the first colon, less one leading space.
func field(line []byte) (name string, value []byte) {
	i := bytes.IndexByte(line, ':')
	if i == 0 {
		return "", nil // a comment
	}
	if i < 0 {
		return string(line), nil
	}
	value = line[i+1:]
	if len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	return string(line[:i]), value
}

// ReplaceData returns body with event e's data replaced by data, written as
// one "data:" line per line of data where its first data line was; the
// event's other lines, and every other event, are unchanged.
func ReplaceData(body []byte, e Event, data []byte) []byte {
	out := make([]byte, 0, len(body)+len(data))
	pos := e.span.start
	out = append(out, body[:pos]...)
	for i, l := range e.lines {
		out = append(out, body[pos:l.start]...)
		if i == 0 {
			for _, line := range bytes.Split(data, []byte("\n")) {
				out = append(out, "data: "...)
				out = append(out, line...)
				out = append(out, '\n')
			}
		}
		pos = l.end
	}
	return append(out, body[pos:]...)
}
