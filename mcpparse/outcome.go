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

// failedIn is Failed for one JSON document, a message or a batch: its
// responses as a tools/list response's are read (responses), the call's
// by its id as clients match it (sameResponseID).
func failedIn(doc []byte, id json.RawMessage, maxDepth int) (answered, failed bool) {
	if len(id) == 0 || checkJSON(doc, depthLimit(maxDepth), true) != nil {
		return false, false
	}
	resps, err := responses(trimValue(doc))
	if err != nil {
		return false, false
	}
	for i := range resps {
		a := &resps[i]
		if a.id == nil {
			continue
		}
		if same, err := sameResponseID(a.id, id); err != nil || !same {
			continue
		}
		if a.errorObj != nil {
			return true, true
		}
		for _, m := range a.list.members {
			var buf [64]byte
			if string(nameOf(&buf, m.name)) == "isError" {
				return true, string(m.value) == "true"
			}
		}
		return true, false
	}
	return false, false
}
