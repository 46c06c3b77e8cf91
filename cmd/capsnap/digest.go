package main

import (
	"fmt"
	"io"
	"os"

	"github.com/capsnap/capsnap/mcpparse"
)

// digest prints the schema digest of each tool of the tools/list result,
// or response, in file.
func digest(file string, stdout io.Writer) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("digest: %w", err)
	}
	tools, err := mcpparse.ToolsDigests(data)
	if err != nil {
		return fmt.Errorf("digest %s: %w", file, err)
	}
	for _, t := range tools {
		fmt.Fprintf(stdout, "%s %s\n", t.Name, t.Digest)
	}
	return nil
}
