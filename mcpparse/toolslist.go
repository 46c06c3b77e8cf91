package mcpparse

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
)

// ToolsList is one tools/list response as the server sent it toward the
// agent: the JSON-RPC document (the whole body for an application/json
// response, the data of one event for text/event-stream), read as strictly
// as Parse reads a request, with every delivered tool kept as its exact
// bytes so that the response can be rewritten to a subset of them without
// re-encoding anything the server wrote.
type ToolsList struct {
	doc []byte
	// Error is set when the response to the request is a JSON-RPC error:
	// it delivers no tools, and passes through unchanged.
	Error bool
	// Tools are the delivered tools, in the order of the list.
	Tools []DeliveredTool
	// NextCursor is result.nextCursor: more tools on a next page.
	NextCursor string
	// TTLMs is result.ttlMs (2026-07-28): how long the client may cache
	// the list; -1 when absent.
	TTLMs int64
	// CacheScope is result.cacheScope (2026-07-28): "public" or "private",
	// "" when absent.
	CacheScope string

	// tools, ttl and scope are the spans of result.tools, result.ttlMs
	// and result.cacheScope in doc.
	tools, ttl, scope span
}

type span struct{ start, end int }

// DeliveredTool is one tool definition of a delivered list.
type DeliveredTool struct {
	Name string
	// Digest is its schema digest, as ToolDigest computes it.
	Digest string
	// Raw is the definition exactly as the server sent it.
	Raw []byte
}

// ReadToolsList reads doc, the JSON-RPC document of a tools/list response,
// and returns the response to the request with the given id: doc is that
// response, or (2025-03-26) a batch that holds it beside requests and
// notifications. Anything a client might read differently from capsnap is
// an error: non-strict JSON, more than one response, a result whose tools
// are not an array of definitions with distinct names.
func ReadToolsList(doc []byte, id json.RawMessage, maxDepth int) (*ToolsList, error) {
	maxDepth, err := readLimits(id, maxDepth)
	if err != nil {
		return nil, err
	}
	return readList(doc, id, maxDepth)
}

// readList is ReadToolsList once the limits are checked.
func readList(doc []byte, id json.RawMessage, maxDepth int) (*ToolsList, error) {
	if err := checkJSON(doc, maxDepth, true); err != nil {
		return nil, fmt.Errorf("tools/list response is not strict JSON: %w", err)
	}
	resps, err := responses(trimValue(doc))
	if err != nil {
		return nil, fmt.Errorf("tools/list response: %w", err)
	}
	if len(resps) != 1 {
		return nil, fmt.Errorf("tools/list response: %d responses where one must answer id %s", len(resps), excerpt(id))
	}
	return readListResponse(doc, &resps[0], id)
}

// answer is a message some client could take for a response, with the
// members a response is read by, as found by the one walk of its members
// that responses makes. A tools/list response is mostly its tools, so
// that walk reads an object result as a tools/list result (list) instead
// of skipping it, and readListResponse then reads what it found: walking
// the document is, once digests are remembered, most of reading it.
type answer struct {
	jsonrpc, id, result, errorObj []byte
	list                          listResult
}

// listResult is an object result, walked once as a tools/list result: its
// members in order, but for an array "tools", which is kept with its
// elements (each a DeliveredTool with only its Raw bytes). Nothing in it
// is validated yet.
type listResult struct {
	members []member
	tools   []byte
	defs    []DeliveredTool
}

type member struct{ name, value []byte }

// readResult walks the checked object that starts at data[at] and returns
// its listResult and the offset just past it.
func readResult(data []byte, at int) (listResult, int) {
	var r listResult
	it := members{data: data, pos: at + 1}
	for {
		name, vat, ok := it.nextName()
		if !ok {
			break
		}
		if data[vat] == '[' && stringIs(name, "tools") {
			r.defs, it.pos = elementsFrom(data, vat)
			r.tools = data[vat:it.pos]
			continue
		}
		it.pos = skipValue(data, vat)
		r.members = append(r.members, member{name, data[vat:it.pos]})
	}
	return r, min(skipSpace(data, it.pos)+1, len(data))
}

// responses returns the messages of a checked JSON-RPC document (a message
// or a batch) that some client could take for a response: every one but a
// request or notification, which has a "method" that is a string and no
// result or error. Which one a client then matches to its request differs
// (Python's takes the first response on the stream whatever its id,
// TypeScript's compares ids as numbers, so "1" answers 1), so a tools/list
// response is read only when it holds exactly one.
func responses(v []byte) ([]answer, error) {
	var msgs [][]byte
	switch v[0] {
	case '{':
		msgs = [][]byte{v}
	case '[':
		it := elementsOf(v)
		for {
			el, ok := it.next()
			if !ok {
				break
			}
			msgs = append(msgs, el)
		}
	default:
		return nil, fmt.Errorf("a JSON %s, not a JSON-RPC message", jsonType(v))
	}
	var out []answer
	for _, m := range msgs {
		if m[0] != '{' {
			return nil, fmt.Errorf("a batch element is a JSON %s, not a message", jsonType(m))
		}
		// A member that is one of messageMembers in another letter case
		// is refused rather than read one way: the TypeScript and Python
		// SDKs match names exactly, encoding/json would not.
		var method []byte
		var a answer
		it := membersOf(m)
		for {
			name, at, ok := it.nextName()
			if !ok {
				break
			}
			var buf [64]byte
			k := nameOf(&buf, name)
			if string(k) == "result" && m[at] == '{' {
				a.list, it.pos = readResult(m, at)
				a.result = m[at:it.pos]
				continue
			}
			it.pos = skipValue(m, at)
			val := m[at:it.pos]
			switch string(k) {
			case "method":
				method = val
			case "jsonrpc":
				a.jsonrpc = val
			case "id":
				a.id = val
			case "result":
				a.result = val
			case "error":
				a.errorObj = val
			default:
				if g, ok := caseVariant(k, messageMembers); ok {
					return nil, fmt.Errorf("member %s is %q in another letter case", excerpt(k), g)
				}
			}
		}
		if a.result != nil || a.errorObj != nil || method == nil || method[0] != '"' {
			out = append(out, a)
		}
	}
	return out, nil
}

// readLimits checks the request id a response must answer and bounds the
// depth as Parse does.
func readLimits(id json.RawMessage, maxDepth int) (int, error) {
	if len(id) == 0 {
		return 0, fmt.Errorf("tools/list response: the request had no id")
	}
	return depthLimit(maxDepth), nil
}

// depthLimit is maxDepth as Parse bounds it: the default for none, and
// never past maxDepthCap.
func depthLimit(maxDepth int) int {
	switch {
	case maxDepth <= 0:
		return defaultMaxDepth
	case maxDepth > maxDepthCap:
		return maxDepthCap
	}
	return maxDepth
}

// sameResponseID reports whether a response's id answers the request's.
// A numeric id must be an integer spelled canonically, as a request's must
// be (checkID): clients read numeric ids as numbers, so 1.0 or 1e0 would
// answer id 1 for them while differing from it byte for byte.
func sameResponseID(rid []byte, id json.RawMessage) (bool, error) {
	switch {
	case rid[0] == 'n':
		return false, nil
	case rid[0] != '"':
		if checkID(rid) != nil {
			return false, fmt.Errorf("response id %s is not a string or an integer spelled canonically", excerpt(rid))
		}
	}
	return sameID(rid, id), nil
}

func readListResponse(doc []byte, resp *answer, id json.RawMessage) (*ToolsList, error) {
	l := &ToolsList{doc: doc, TTLMs: -1}
	result, errObj, rid := resp.result, resp.errorObj, resp.id
	version := string(resp.jsonrpc) == `"2.0"`
	same := false
	if rid != nil {
		var err error
		if same, err = sameResponseID(rid, id); err != nil {
			return nil, fmt.Errorf("tools/list response: %w", err)
		}
	}
	switch {
	case !version:
		return nil, fmt.Errorf(`tools/list response: jsonrpc is not "2.0"`)
	case !same:
		return nil, fmt.Errorf("tools/list response: id %s does not answer the request's id %s", excerpt(string(rid)), excerpt(id))
	case (result == nil) == (errObj == nil):
		return nil, fmt.Errorf("tools/list response: exactly one of result and error is required")
	case errObj != nil:
		if err := checkErrorObject(errObj); err != nil {
			return nil, fmt.Errorf("tools/list response: %w", err)
		}
		l.Error = true
		return l, nil
	case result[0] != '{':
		return nil, fmt.Errorf("tools/list response: result is a JSON %s, not an object", jsonType(result))
	}
	tools := resp.list.tools
	l.Tools = resp.list.defs
	for _, m := range resp.list.members {
		var buf [64]byte
		k, v := nameOf(&buf, m.name), m.value
		switch string(k) {
		case "tools":
			tools = v
		case "nextCursor":
			if v[0] != '"' {
				return nil, fmt.Errorf("tools/list response: nextCursor is a JSON %s, not a string", jsonType(v))
			}
			l.NextCursor = unquote(v)
		case "ttlMs":
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("tools/list response: ttlMs %s is not a non-negative integer", excerpt(v))
			}
			l.TTLMs, l.ttl = n, spanOf(doc, v)
		case "cacheScope":
			if v[0] != '"' {
				return nil, fmt.Errorf("tools/list response: cacheScope is a JSON %s, not a string", jsonType(v))
			}
			l.CacheScope, l.scope = unquote(v), spanOf(doc, v)
		default:
			if g, ok := caseVariant(k, resultMembers); ok {
				return nil, fmt.Errorf("tools/list response: result member %s is %q in another letter case", excerpt(k), g)
			}
		}
	}
	if tools == nil || tools[0] != '[' {
		return nil, fmt.Errorf("tools/list response: result.tools is missing or not an array")
	}
	l.tools = spanOf(doc, tools)
	seen := make(map[string]bool, len(l.Tools))
	for i := range l.Tools {
		t := &l.Tools[i]
		var err error
		if t.Digest, t.Name, err = deliveredDigests.digest(t.Raw); err != nil {
			return nil, fmt.Errorf("tools/list response: tool %d: %w", i, err)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("tools/list response: tool %s is listed twice", excerpt(t.Name))
		}
		seen[t.Name] = true
	}
	return l, nil
}

// elementsFrom reads the checked array at data[at:]: a tool for each
// element, with only its Raw bytes, and the offset just past the array.
func elementsFrom(data []byte, at int) ([]DeliveredTool, int) {
	var tools []DeliveredTool
	e := elements{data: data, pos: at + 1}
	for {
		v, ok := e.next()
		if !ok {
			return tools, min(skipSpace(data, e.pos)+1, len(data))
		}
		tools = append(tools, DeliveredTool{Raw: v})
	}
}

// resultMembers are the tools/list result members capsnap reads.
var resultMembers = []string{"tools", "nextCursor", "ttlMs", "cacheScope"}

// spanOf is the span of sub, a subslice of doc, within doc.
func spanOf(doc, sub []byte) span {
	start := cap(doc) - cap(sub)
	return span{start, start + len(sub)}
}

// Rewrite returns the document with only the tools keep says to keep, each
// byte for byte as delivered, ttlMs lowered to maxTTLMs if it was higher,
// and, when it keeps fewer tools than the server listed, cacheScope
// "private": the list is then this principal's, and a cache shared across
// authorization contexts must not serve it to another (2026-07-28's
// CacheableResult), whatever the server said. Everything else in the
// document is unchanged. A JSON-RPC error response is returned as it is.
func (l *ToolsList) Rewrite(keep []bool, maxTTLMs int64) []byte {
	if l.Error {
		return l.doc
	}
	// The kept tools are written straight into one buffer of exactly the
	// result's size: the delivered list is often a small part of the
	// server's, and a buffer the size of the server's list (or a second
	// one for the tools) would be garbage on every listing.
	size := len("[]")
	kept := 0
	for i, t := range l.Tools {
		if keep[i] {
			size += len(t.Raw)
			kept++
		}
	}
	size += max(kept-1, 0) // the commas between them
	edits := []edit{{at: l.tools, size: size, write: func(out []byte) []byte {
		out = append(out, '[')
		first := true
		for i, t := range l.Tools {
			if !keep[i] {
				continue
			}
			if !first {
				out = append(out, ',')
			}
			first = false
			out = append(out, t.Raw...)
		}
		return append(out, ']')
	}}}
	if maxTTLMs = max(maxTTLMs, 0); l.TTLMs >= 0 && l.TTLMs > maxTTLMs {
		ttl := strconv.AppendInt(nil, maxTTLMs, 10)
		edits = append(edits, edit{at: l.ttl, size: len(ttl), write: func(out []byte) []byte { return append(out, ttl...) }})
	}
	const private = `"private"`
	if l.scope.end > 0 && kept < len(l.Tools) {
		edits = append(edits, edit{at: l.scope, size: len(private), write: func(out []byte) []byte { return append(out, private...) }})
	}
	slices.SortFunc(edits, func(a, b edit) int { return a.at.start - b.at.start })
	total := len(l.doc)
	for _, e := range edits {
		total += e.size - (e.at.end - e.at.start)
	}
	out := make([]byte, 0, total)
	pos := 0
	for _, e := range edits {
		out = e.write(append(out, l.doc[pos:e.at.start]...))
		pos = e.at.end
	}
	return append(out, l.doc[pos:]...)
}

// edit replaces the span at with what write appends, size bytes.
type edit struct {
	at    span
	size  int
	write func([]byte) []byte
}

// Delivery is the body of a tools/list response as the agent would
// receive it: application/json, or text/event-stream with the response in
// one of its events.
type Delivery struct {
	*ToolsList
	body []byte
	// event is the event holding the response; nil for a JSON body.
	event *Event
}

// ReadDelivery reads a tools/list response body of the given content type
// (application/json or text/event-stream) for the request with id. In an
// event stream, every event that carries data must be strict JSON, and
// exactly one must answer id; the others (progress, logging, the server's
// own requests) are kept as they are.
func ReadDelivery(contentType string, body []byte, id json.RawMessage, maxDepth int) (*Delivery, error) {
	maxDepth, err := readLimits(id, maxDepth)
	if err != nil {
		return nil, err
	}
	switch FramingOf(contentType) {
	case FramingJSON:
		l, err := readList(body, id, maxDepth)
		if err != nil {
			return nil, err
		}
		return &Delivery{ToolsList: l, body: body}, nil
	case FramingSSE:
		events, err := ReadEventStream(body)
		if err != nil {
			return nil, err
		}
		d := &Delivery{body: body}
		for i := range events {
			e := &events[i]
			if len(e.lines) == 0 || len(bytes.TrimSpace(e.Data)) == 0 {
				continue // a priming event or a comment: no message
			}
			// Every SDK reads only "message" events; capsnap must not
			// read, rewrite and pin one no client reads, beside one it
			// does.
			if e.Type != "" && e.Type != "message" {
				return nil, fmt.Errorf("event %d has type %q: only message events carry MCP messages", i, e.Type)
			}
			if err := checkJSON(e.Data, maxDepth, true); err != nil {
				return nil, fmt.Errorf("event %d is not strict JSON: %w", i, err)
			}
			resps, err := responses(trimValue(e.Data))
			if err != nil {
				return nil, fmt.Errorf("event %d: %w", i, err)
			}
			if len(resps) == 0 {
				continue // the server's requests and notifications
			}
			if d.event != nil || len(resps) > 1 {
				return nil, fmt.Errorf("the stream holds more than one response where one must answer id %s", excerpt(id))
			}
			// The event's data is checked and holds this one response.
			if d.ToolsList, err = readListResponse(e.Data, &resps[0], id); err != nil {
				return nil, err
			}
			d.event = e
		}
		if d.event == nil {
			return nil, fmt.Errorf("no event answers id %s", excerpt(id))
		}
		return d, nil
	default:
		return nil, fmt.Errorf("content type %q is not one that every MCP client reads alike: application/json or text/event-stream, in UTF-8, and nothing else", contentType)
	}
}

// Rewrite returns the body with the response rewritten as
// ToolsList.Rewrite does; in an event stream, only its event changes.
func (d *Delivery) Rewrite(keep []bool, maxTTLMs int64) []byte {
	if d.Error {
		return d.body
	}
	doc := d.ToolsList.Rewrite(keep, maxTTLMs)
	if d.event == nil {
		return doc
	}
	return ReplaceData(d.body, *d.event, doc)
}
