package mcpparse

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
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

	// tools and ttl are the spans of result.tools and result.ttlMs in doc.
	tools, ttl span
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
// response, or (2025-03-26) a batch that holds it. Anything a client might
// read differently from capsnap is an error: non-strict JSON, a batch
// answering the id twice, a result whose tools are not an array of
// definitions with distinct names.
func ReadToolsList(doc []byte, id json.RawMessage, maxDepth int) (*ToolsList, error) {
	maxDepth, err := readLimits(id, maxDepth)
	if err != nil {
		return nil, err
	}
	if err := checkJSON(doc, maxDepth, true); err != nil {
		return nil, fmt.Errorf("tools/list response is not strict JSON: %w", err)
	}
	v := trimValue(doc)
	var resp []byte
	switch v[0] {
	case '{':
		resp = v
	case '[':
		it := elementsOf(v)
		for {
			el, ok := it.next()
			if !ok {
				break
			}
			if el[0] != '{' {
				return nil, fmt.Errorf("tools/list response: batch element is a JSON %s", jsonType(el))
			}
			answer, err := answers(el, id)
			if err != nil {
				return nil, fmt.Errorf("tools/list response: %w", err)
			}
			if answer {
				if resp != nil {
					return nil, fmt.Errorf("tools/list response: the batch answers id %s twice", excerpt(id))
				}
				resp = el
			}
		}
		if resp == nil {
			return nil, fmt.Errorf("tools/list response: the batch has no response to id %s", excerpt(id))
		}
	default:
		return nil, fmt.Errorf("tools/list response is a JSON %s, not a JSON-RPC response", jsonType(v))
	}
	return readListResponse(doc, resp, id)
}

// readLimits checks the request id a response must answer and bounds the
// depth as Parse does.
func readLimits(id json.RawMessage, maxDepth int) (int, error) {
	if len(id) == 0 {
		return 0, fmt.Errorf("tools/list response: the request had no id")
	}
	switch {
	case maxDepth <= 0:
		maxDepth = defaultMaxDepth
	case maxDepth > maxDepthCap:
		maxDepth = maxDepthCap
	}
	return maxDepth, nil
}

// member returns the value of the member of a checked object whose name
// is key in any letter case: Go's encoding/json, which the Go SDK decodes
// messages with, matches names that way, and a strict check (fold) has
// made sure at most one member does.
func member(obj []byte, key string) ([]byte, bool) {
	it := membersOf(obj)
	for {
		name, v, ok := it.next()
		if !ok {
			return nil, false
		}
		var buf [64]byte
		if strings.EqualFold(string(nameOf(&buf, name)), key) {
			return v, true
		}
	}
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

func readListResponse(doc, resp []byte, id json.RawMessage) (*ToolsList, error) {
	l := &ToolsList{doc: doc, TTLMs: -1}
	var result, errObj, rid []byte
	var version bool
	it := membersOf(resp)
	for {
		name, v, ok := it.next()
		if !ok {
			break
		}
		var buf [64]byte
		switch strings.ToLower(string(nameOf(&buf, name))) {
		case "jsonrpc":
			version = string(v) == `"2.0"`
		case "id":
			rid = v
		case "result":
			result = v
		case "error":
			errObj = v
		}
	}
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
	var tools []byte
	it = membersOf(result)
	for {
		name, v, ok := it.next()
		if !ok {
			break
		}
		var buf [64]byte
		switch strings.ToLower(string(nameOf(&buf, name))) {
		case "tools":
			tools = v
		case "nextcursor":
			if v[0] != '"' {
				return nil, fmt.Errorf("tools/list response: nextCursor is a JSON %s, not a string", jsonType(v))
			}
			l.NextCursor = unquote(v)
		case "ttlms":
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("tools/list response: ttlMs %s is not a non-negative integer", excerpt(v))
			}
			l.TTLMs, l.ttl = n, spanOf(doc, v)
		}
	}
	if tools == nil || tools[0] != '[' {
		return nil, fmt.Errorf("tools/list response: result.tools is missing or not an array")
	}
	l.tools = spanOf(doc, tools)
	seen := map[string]bool{}
	el := elementsOf(tools)
	for i := 0; ; i++ {
		def, ok := el.next()
		if !ok {
			break
		}
		digest, name, _, err := digestTool(def)
		if err != nil {
			return nil, fmt.Errorf("tools/list response: tool %d: %w", i, err)
		}
		if seen[name] {
			return nil, fmt.Errorf("tools/list response: tool %s is listed twice", excerpt(name))
		}
		seen[name] = true
		l.Tools = append(l.Tools, DeliveredTool{Name: name, Digest: digest, Raw: def})
	}
	return l, nil
}

// spanOf is the span of sub, a subslice of doc, within doc.
func spanOf(doc, sub []byte) span {
	start := cap(doc) - cap(sub)
	return span{start, start + len(sub)}
}

// Rewrite returns the document with only the tools keep says to keep, each
// byte for byte as delivered, and ttlMs lowered to maxTTLMs if it was
// higher. Everything else in the document is unchanged. A JSON-RPC error
// response is returned as it is.
func (l *ToolsList) Rewrite(keep []bool, maxTTLMs int64) []byte {
	if l.Error {
		return l.doc
	}
	maxTTLMs = max(maxTTLMs, 0)
	var tools bytes.Buffer
	tools.WriteByte('[')
	for i, t := range l.Tools {
		if !keep[i] {
			continue
		}
		if tools.Len() > 1 {
			tools.WriteByte(',')
		}
		tools.Write(t.Raw)
	}
	tools.WriteByte(']')
	type edit struct {
		at   span
		with []byte
	}
	edits := []edit{{l.tools, tools.Bytes()}}
	if l.TTLMs >= 0 && l.TTLMs > maxTTLMs {
		e := edit{l.ttl, strconv.AppendInt(nil, maxTTLMs, 10)}
		if e.at.start < l.tools.start {
			edits = []edit{e, edits[0]}
		} else {
			edits = append(edits, e)
		}
	}
	out := make([]byte, 0, len(l.doc))
	pos := 0
	for _, e := range edits {
		out = append(out, l.doc[pos:e.at.start]...)
		out = append(out, e.with...)
		pos = e.at.end
	}
	return append(out, l.doc[pos:]...)
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
	switch mediaType(contentType) {
	case "application/json":
		l, err := ReadToolsList(body, id, maxDepth)
		if err != nil {
			return nil, err
		}
		return &Delivery{ToolsList: l, body: body}, nil
	case "text/event-stream":
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
			if err := checkJSON(e.Data, maxDepth, true); err != nil {
				return nil, fmt.Errorf("event %d is not strict JSON: %w", i, err)
			}
			answer, err := answers(trimValue(e.Data), id)
			if err != nil {
				return nil, fmt.Errorf("event %d: %w", i, err)
			}
			if !answer {
				continue
			}
			if d.event != nil {
				return nil, fmt.Errorf("two events answer id %s", excerpt(id))
			}
			if d.ToolsList, err = ReadToolsList(e.Data, id, maxDepth); err != nil {
				return nil, err
			}
			d.event = e
		}
		if d.event == nil {
			return nil, fmt.Errorf("no event answers id %s", excerpt(id))
		}
		return d, nil
	default:
		return nil, fmt.Errorf("content type %q is neither application/json nor text/event-stream", contentType)
	}
}

// answers reports whether the checked JSON-RPC document v (a message or a
// batch) holds a response to id: a message with that id and no method (a
// request the server sends the client may use the same id). Names match in
// any letter case and numeric ids must be canonical, so that nothing a
// client could take for the answer escapes capsnap.
func answers(v []byte, id json.RawMessage) (bool, error) {
	if v[0] == '[' {
		it := elementsOf(v)
		for {
			el, ok := it.next()
			if !ok {
				return false, nil
			}
			if el[0] != '{' {
				continue
			}
			if a, err := answers(el, id); a || err != nil {
				return a, err
			}
		}
	}
	if v[0] != '{' {
		return false, nil
	}
	rid, ok := member(v, "id")
	if !ok {
		return false, nil
	}
	same, err := sameResponseID(rid, id)
	if !same || err != nil {
		return false, err
	}
	_, isRequest := member(v, "method")
	return !isRequest, nil
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

// mediaType is the lower-case media type of a Content-Type value, without
// its parameters.
func mediaType(ct string) string {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.ToLower(strings.TrimSpace(ct))
}
