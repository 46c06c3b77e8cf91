package mcpparse

import (
	"bytes"
	"encoding/json"
)

// Failed reports, for content (whole JSON-RPC content of an answer: a JSON
// document, or whole events of an event stream when sse), whether it holds
// the response to the request id, and whether that response says the
// request failed: a JSON-RPC error, or a tools/call result whose isError is
// true. Member names are matched exactly, as the SDK clients match them;
// content that cannot be read strictly holds no response: a caller that
// gives something back on a failure keeps it then.
func Failed(content []byte, sse bool, id json.RawMessage, maxDepth int) (answered, failed bool) {
	if !sse {
		return failedIn(content, id, maxDepth)
	}
	events, err := ReadEventStream(content)
	if err != nil {
		return false, false
	}
	for _, e := range events {
		if len(bytes.TrimSpace(e.Data)) == 0 {
			continue
		}
		if answered, failed = failedIn(e.Data, id, maxDepth); answered {
			return answered, failed
		}
	}
	return false, false
}

// failedIn is Failed for one JSON document, a message or a batch.
func failedIn(doc []byte, id json.RawMessage, maxDepth int) (answered, failed bool) {
	if len(id) == 0 || checkJSON(doc, depthLimit(maxDepth), true) != nil {
		return false, false
	}
	doc = trimValue(doc)
	msgs := []json.RawMessage{doc}
	if doc[0] == '[' {
		if json.Unmarshal(doc, &msgs) != nil {
			return false, false
		}
	}
	for _, m := range msgs {
		var fields map[string]json.RawMessage
		if json.Unmarshal(m, &fields) != nil || !bytes.Equal(trimValue(fields["id"]), trimValue(id)) {
			continue
		}
		if _, isErr := fields["error"]; isErr {
			return true, true
		}
		var result map[string]json.RawMessage
		if json.Unmarshal(fields["result"], &result) != nil {
			return true, false
		}
		return true, bytes.Equal(trimValue(result["isError"]), []byte("true"))
	}
	return false, false
}
