package decide

import (
	"github.com/capsnap/capsnap/argschema"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/internal/bounded"
	"github.com/capsnap/capsnap/mcpparse"
)

// schemas holds the compiled inputSchema of each tool definition, by
// schema digest: a digest names one definition, so a compiled schema never
// needs invalidating, only bounding.
type schemas struct {
	bounded.Map[string, compiled]
}

type compiled struct {
	schema *argschema.Schema
	// params are the schema's x-mcp-header annotations.
	params []mcpparse.ParamHeader
	err    error
}

// maxSchemas bounds the compiled-schema cache. Catalogs change rarely, so
// when it is full the simplest correct thing is to start over.
const maxSchemas = 4096

func (c *schemas) get(digest string, inputSchema []byte) compiled {
	return c.Map.Get(digest, maxSchemas, func() (string, compiled) {
		s, err := argschema.Compile(inputSchema)
		if err != nil {
			return digest, compiled{err: err}
		}
		params, err := mcpparse.ParamAnnotations(inputSchema)
		return digest, compiled{schema: s, params: params, err: err}
	})
}

// checkArguments holds a call's arguments to the pinned definition's
// inputSchema, identified by its digest, and its Mcp-Param-* headers to
// the arguments, as that schema's x-mcp-header annotations bind them; and
// returns the arguments decoded (numbers as json.Number, exact for the
// schema's bounds) for the constraints. The headers must be there in
// version 2026-07-28, whose clients must send them, and agree when sent in
// any version: what routes on them before the server would otherwise
// decide on what the server does not execute.
func (c *schemas) checkArguments(digest string, inputSchema []byte, call *mcpparse.Message, version mcpparse.Version, params map[string]string) (map[string]any, *deny.Error) {
	s := c.get(digest, inputSchema)
	if s.err != nil {
		return nil, deny.Errorf(deny.InvalidArguments, "the pinned inputSchema cannot be used: %v", s.err)
	}
	args, err := call.DecodeArguments()
	if err != nil {
		return nil, deny.Errorf(deny.InvalidArguments, "arguments: %v", err)
	}
	if fail := mcpparse.CheckParamHeaders(s.params, args, params, version == mcpparse.V20260728); fail != nil {
		return nil, fail
	}
	if err := s.schema.Validate(args); err != nil {
		return nil, deny.Errorf(deny.InvalidArguments, "%v", err)
	}
	return args, nil
}
