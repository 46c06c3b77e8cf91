package extauthz

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/capsnap/capsnap/deny"
)

// schemas holds the compiled inputSchema of each tool definition, by
// schema digest: a digest names one definition, so a compiled schema never
// needs invalidating, only bounding.
type schemas struct {
	mu sync.Mutex
	m  map[string]compiled
}

type compiled struct {
	schema *jsonschema.Schema
	err    error
}

// maxSchemas bounds the compiled-schema cache. Catalogs change rarely, so
// when it is full the simplest correct thing is to start over.
const maxSchemas = 4096

// noLoader refuses every $ref to a document outside the schema: a pinned
// schema must not change meaning with a file or URL capsnap would fetch.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s: external references are not followed", url)
}

func (c *schemas) get(digest string, inputSchema []byte) compiled {
	c.mu.Lock()
	defer c.mu.Unlock()
	if got, ok := c.m[digest]; ok {
		return got
	}
	if c.m == nil || len(c.m) >= maxSchemas {
		c.m = map[string]compiled{}
	}
	got := compile(inputSchema)
	c.m[digest] = got
	return got
}

func compile(inputSchema []byte) compiled {
	if len(inputSchema) == 0 {
		return compiled{err: errors.New("the tool publishes no inputSchema")}
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(inputSchema))
	if err != nil {
		return compiled{err: err}
	}
	c := jsonschema.NewCompiler()
	// MCP tool schemas default to JSON Schema 2020-12.
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	const loc = "capsnap:inputSchema"
	if err := c.AddResource(loc, doc); err != nil {
		return compiled{err: err}
	}
	s, err := c.Compile(loc)
	return compiled{schema: s, err: err}
}

// checkArguments holds a call's arguments to the pinned definition's
// inputSchema, identified by its digest, and returns them decoded (numbers
// as json.Number, exact for the schema's bounds) for the constraints.
func (c *schemas) checkArguments(digest string, inputSchema, arguments []byte) (map[string]any, *deny.Error) {
	s := c.get(digest, inputSchema)
	if s.err != nil {
		return nil, deny.Errorf(deny.InvalidArguments, "the pinned inputSchema cannot be used: %v", s.err)
	}
	if len(arguments) == 0 {
		arguments = []byte("{}")
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(arguments))
	if err != nil {
		return nil, deny.Errorf(deny.InvalidArguments, "arguments: %v", err)
	}
	if err := s.schema.Validate(inst); err != nil {
		return nil, deny.Errorf(deny.InvalidArguments, "arguments do not satisfy the pinned inputSchema: %s", oneLine(err))
	}
	args, ok := inst.(map[string]any)
	if !ok {
		// MCP's arguments are an object; mcpparse refuses anything else.
		return nil, deny.Errorf(deny.InvalidArguments, "arguments are not an object")
	}
	return args, nil
}

// oneLine flattens a validation error for a detail field.
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
