// Package argschema holds a tool call's arguments to the inputSchema of the
// definition its snapshot pinned (JSON Schema 2020-12).
//
// The authority is santhosh-tekuri/jsonschema. Most tool schemas use a small
// part of the language (typed properties, required, closed objects, enums,
// bounds), and validating those through the general engine costs more than
// the rest of a Check together, so a schema that uses only that part is also
// compiled into a direct check. The direct check may only accept: whatever
// it does not accept, the engine decides, and every denial's message is the
// engine's. A differential fuzz target holds the two to the same verdicts.
package argschema

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Schema is one compiled inputSchema.
type Schema struct {
	engine *jsonschema.Schema
	// direct is nil when the schema uses anything the direct check does
	// not implement.
	direct *node
}

// noLoader refuses every $ref to a document outside the schema: a pinned
// schema must not change meaning with a file or URL capsnap would fetch.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s: external references are not followed", url)
}

// Compile compiles an inputSchema.
func Compile(inputSchema []byte) (*Schema, error) {
	if len(inputSchema) == 0 {
		return nil, errors.New("the tool publishes no inputSchema")
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(inputSchema))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	// MCP tool schemas default to JSON Schema 2020-12.
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	const loc = "capsnap:inputSchema"
	if err := c.AddResource(loc, doc); err != nil {
		return nil, err
	}
	engine, err := c.Compile(loc)
	if err != nil {
		return nil, err
	}
	return &Schema{engine: engine, direct: compileNode(doc, true)}, nil
}

// Direct reports whether the schema has a direct check, for tests and
// benchmarks.
func (s *Schema) Direct() bool { return s.direct != nil }

// Validate holds arguments already decoded (mcpparse.DecodeObject's
// values) to the schema.
func (s *Schema) Validate(args map[string]any) error {
	if s.direct == nil || !s.direct.accepts(args) {
		if err := s.engine.Validate(args); err != nil {
			return fmt.Errorf("arguments do not satisfy the pinned inputSchema: %s", oneLine(err))
		}
	}
	return nil
}

// oneLine flattens a validation error for a denial's detail.
func oneLine(err error) string {
	var ve *jsonschema.ValidationError
	msg := err.Error()
	if errors.As(err, &ve) {
		var causes []string
		for _, c := range ve.Causes {
			causes = append(causes, c.Error())
		}
		if len(causes) > 0 {
			msg = strings.Join(causes, "; ")
		}
	}
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	return msg
}
