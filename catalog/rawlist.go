package catalog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/mcpparse"
)

// rawLists keeps the bytes of each tools/list response the SDK's client
// reads, as the server sent them. capsnap's view must digest a tool as the
// server wrote it, the bytes an agent is delivered: the SDK decodes into
// mcp.Tool, and encoding that again writes what the server left out (an
// absent readOnlyHint comes back as false) and drops what mcp.Tool has no
// field for, so a server on any other SDK would see every such tool
// withheld from its agents as confirmed at another digest.
type rawLists struct {
	base http.RoundTripper

	mu sync.Mutex
	// last is the latest tools/list exchange. The session lists one page
	// at a time, so the one listTools just got back is the latest.
	last *rawList
}

type rawList struct {
	id          json.RawMessage
	contentType string

	mu   sync.Mutex
	body []byte
}

func (r *rawLists) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || req.Body == nil {
		return r.base.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if json.Unmarshal(body, &msg) != nil || msg.Method != "tools/list" || len(msg.ID) == 0 {
		return r.base.RoundTrip(req)
	}
	resp, err := r.base.RoundTrip(req)
	if err != nil || resp.StatusCode/100 != 2 {
		return resp, err
	}
	l := &rawList{id: msg.ID, contentType: resp.Header.Get("Content-Type")}
	resp.Body = &recordedBody{ReadCloser: resp.Body, list: l}
	r.mu.Lock()
	r.last = l
	r.mu.Unlock()
	return resp, nil
}

// recordedBody keeps what the SDK reads of a response body. The SDK reads
// an event stream as it arrives, so the answer it returned is in what was
// read, even while the stream is still open.
type recordedBody struct {
	io.ReadCloser
	list *rawList
}

func (b *recordedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.list.mu.Lock()
	b.list.body = append(b.list.body, p[:n]...)
	b.list.mu.Unlock()
	return n, err
}

// definitions returns the raw definitions of the page res, which the SDK
// just decoded from the latest tools/list response: that response's tools
// as the server wrote them, which must be res's tools, in order.
func (r *rawLists) definitions(res *mcp.ListToolsResult) ([]json.RawMessage, error) {
	r.mu.Lock()
	l := r.last
	r.last = nil
	r.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("raw tools/list: no response was recorded")
	}
	l.mu.Lock()
	body := slices.Clone(l.body)
	l.mu.Unlock()
	d, err := mcpparse.ReadDelivery(l.contentType, completeEvents(l.contentType, body), l.id, 0)
	if err != nil {
		return nil, fmt.Errorf("raw tools/list: %w", err)
	}
	if d.Error || len(d.Tools) != len(res.Tools) {
		return nil, fmt.Errorf("raw tools/list: the response holds %d tools, the SDK read %d", len(d.Tools), len(res.Tools))
	}
	defs := make([]json.RawMessage, len(d.Tools))
	for i, t := range d.Tools {
		if t.Name != res.Tools[i].Name {
			return nil, fmt.Errorf("raw tools/list: tool %d is %q in the response, %q as the SDK read it", i, t.Name, res.Tools[i].Name)
		}
		defs[i] = slices.Clone(t.Raw)
	}
	return defs, nil
}

// completeEvents cuts an event stream read so far after its last complete
// event: the stream of a tools/list may still be open when its answer has
// been read.
func completeEvents(contentType string, body []byte) []byte {
	if !bytes.HasPrefix(bytes.TrimSpace(bytes.ToLower([]byte(contentType))), []byte("text/event-stream")) {
		return body
	}
	end := max(bytes.LastIndex(body, []byte("\n\n"))+2, bytes.LastIndex(body, []byte("\n\r\n"))+3)
	if end < 3 {
		return body
	}
	return body[:end]
}
