package catalog

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/capsnap/capsnap/mcpparse"
)

// FileSource is a static catalog: a file holding a tools/list result
// ({"tools":[…]}). It is read once, when Run starts; a static catalog
// changes by restarting capsnap, so that every change is a deliberate one.
type FileSource struct {
	Path string
}

var _ Source = (*FileSource)(nil)

// Run implements Source: it publishes the file's tools, then waits for ctx.
func (f *FileSource) Run(ctx context.Context, publish Publish) error {
	defs, err := f.Load()
	publish(defs, err)
	<-ctx.Done()
	return nil
}

// Load reads and checks the file: strict JSON, every tool digestible, no
// name twice.
func (f *FileSource) Load() ([]json.RawMessage, error) {
	data, err := os.ReadFile(f.Path)
	if err != nil {
		return nil, fmt.Errorf("catalog file: %w", err)
	}
	if _, err := mcpparse.ToolsDigests(data); err != nil {
		return nil, fmt.Errorf("catalog file %s: %w", f.Path, err)
	}
	var result struct {
		Tools []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(data, &result); err != nil || result.Tools == nil {
		return nil, fmt.Errorf(`catalog file %s: want a tools/list result {"tools":[…]}`, f.Path)
	}
	return result.Tools, nil
}
