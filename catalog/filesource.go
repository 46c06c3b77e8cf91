package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// FileSource is a catalog read from a file holding one tools/list result,
// {"tools":[…]} (or a JSON-RPC response carrying one). The file is the
// operator's reviewed contract, and the catalog is as fresh as the file:
// it is reread every Interval, and each read confirms the list (so the
// catalog never ages past catalog.max_age while the file is there) or,
// if the file changed, publishes the new one. A file that cannot be read
// or parsed is published as an error, keeping the last good list until
// it too is older than max_age: a file deleted or broken fails closed.
type FileSource struct {
	Path string
	// Interval is how often the file is reread; zero is
	// DefaultFileInterval. It must be well under catalog.max_age.
	Interval time.Duration
}

// DefaultFileInterval is how often a FileSource rereads its file unless
// told otherwise.
const DefaultFileInterval = 2 * time.Second

// Run publishes the file, then again every Interval, until ctx ends. An
// unchanged file is not parsed again.
func (f *FileSource) Run(ctx context.Context, publish Publish) error {
	if f.Path == "" {
		return errors.New("file source: no path")
	}
	every := f.Interval
	if every <= 0 {
		every = DefaultFileInterval
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last []byte
	var defs []json.RawMessage
	var failed string // the error last published, not published again
	for {
		data, err := os.ReadFile(f.Path)
		var d []json.RawMessage
		switch {
		case err != nil:
			err = fmt.Errorf("catalog file: %w", err)
		case last != nil && bytes.Equal(data, last):
			d = defs
		default:
			if d, err = f.parse(data); err == nil {
				last, defs = data, d
			}
		}
		switch {
		case err == nil:
			failed = ""
			publish(d, nil)
		case err.Error() != failed:
			// Once: the catalog keeps the error until a good read, and a
			// broken file would otherwise log a warning every Interval.
			failed = err.Error()
			publish(nil, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Load reads the file and checks it as the catalog will: a tools/list
// result of strict, digestible definitions with no name twice. Run uses it;
// call it directly to refuse a bad file at startup.
func (f *FileSource) Load() ([]json.RawMessage, error) {
	data, err := os.ReadFile(f.Path)
	if err != nil {
		return nil, fmt.Errorf("catalog file: %w", err)
	}
	return f.parse(data)
}

func (f *FileSource) parse(data []byte) ([]json.RawMessage, error) {
	defs, err := parseToolsResult(data)
	if err == nil {
		_, err = parseTools(defs)
	}
	if err != nil {
		return nil, fmt.Errorf("catalog file %s: %w", f.Path, err)
	}
	return defs, nil
}

// parseToolsResult splits a tools/list result, or a JSON-RPC response
// whose result is one (as capsnap digest reads it), into its tool
// definitions.
// Its members are read one by one, case-sensitively and only once each,
// because encoding/json would quietly take the last of two "tools" members,
// or a "Tools". The definitions themselves are checked strictly when they
// are digested.
func parseToolsResult(data []byte) ([]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New(`not a JSON object: want a tools/list result {"tools":[…]}`)
	}
	var (
		defs           []json.RawMessage
		found          bool
		result, rpcErr json.RawMessage
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		switch key := tok.(string); key {
		case "tools":
			if found {
				return nil, errors.New(`"tools" appears twice`)
			}
			found = true
			if v[0] != '[' {
				return nil, errors.New(`"tools" is not an array`)
			}
			if err := json.Unmarshal(v, &defs); err != nil {
				return nil, fmt.Errorf(`"tools": %w`, err)
			}
		case "result":
			// A whole JSON-RPC response, as capsnap digest reads it.
			if result != nil {
				return nil, errors.New(`"result" appears twice`)
			}
			result = v
		case "error":
			rpcErr = v
		case "nextCursor":
			var cursor string
			if err := json.Unmarshal(v, &cursor); err != nil || cursor != "" {
				return nil, errors.New("the file holds one page of a longer list (nextCursor is set)")
			}
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the object")
	}
	switch {
	case found && result != nil:
		return nil, errors.New(`both "tools" and a JSON-RPC "result"`)
	case rpcErr != nil && !found:
		return nil, errors.New("a JSON-RPC error response, not a tools/list result")
	case result != nil:
		return parseToolsResult(result)
	case !found:
		return nil, errors.New(`no "tools" member`)
	}
	return defs, nil
}
