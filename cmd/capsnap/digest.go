package main

import (
	"fmt"
	"io"
	"os"

	"github.com/capsnap/capsnap/mcpparse"
)

func digestCmd(args []string, stdout, _ io.Writer) error {
	if len(args) != 1 {
		return usageError{"digest: exactly one FILE is required"}
	}
	data, err := os.ReadFile(args[0])
	if err != nil {
		return fmt.Errorf("digest: %w", err)
	}
	tools, err := mcpparse.ToolsDigests(data)
	if err != nil {
		return fmt.Errorf("digest %s: %w", args[0], err)
	}
	for _, t := range tools {
		fmt.Fprintf(stdout, "%s %s\n", t.Name, t.Digest)
	}
	return nil
}
