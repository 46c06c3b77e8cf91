// Package pincheck lets an MCP server built on the official Go SDK verify,
// at handler start, that the call capsnap authorized is the call this
// handler is about to run, against the tool definition it serves.
//
// capsnap signs an envelope on every allowed tools/call (package envelope,
// docs/ENVELOPE.md): the tool, the schema digest it verified, the digest of
// the arguments, the audience and a short expiry. A Guard with a Verifier
// checks that envelope, and that its schema digest is the digest of the
// handler's own definition, before any side effect: a request that did not
// pass through Envoy and capsnap, or replays another call's envelope, is
// refused. Between capsnap's decision and the handler's first line the
// server can still redeploy; the schema digest closes that window.
//
// Without a Verifier, a Guard compares the plain x-capsnap-schema-digest
// header instead, which only a server no one but Envoy can reach may trust.
package pincheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/mcpparse"
)

// Header names capsnap sets on an allowed call.
const (
	HeaderSchemaDigest = "X-Capsnap-Schema-Digest"
	HeaderEpoch        = "X-Capsnap-Epoch"
)

// CodeRefused is the JSON-RPC error code of a refusal at handler start;
// capsnap's own denials use the same code, outside JSON-RPC's reserved range.
const CodeRefused = -31000

// Reason is the refusal's data.reason: the handler's definition is not the
// one capsnap authorized.
const Reason = "handler_drift"

// Guard checks calls at handler start.
type Guard struct {
	verifier *envelope.Verifier
}

// NewGuard returns a Guard that checks capsnap's envelope with v; a nil v
// checks the plain schema digest header only.
func NewGuard(v *envelope.Verifier) *Guard { return &Guard{verifier: v} }

// Wrap returns h guarded by g: the call must be the one capsnap authorized
// and its schema digest the digest of def, the definition h is registered
// with. Register the result with the same def:
// srv.AddTool(def, g.Wrap(def, h)).
func (g *Guard) Wrap(def *mcp.Tool, h mcp.ToolHandler) (mcp.ToolHandler, error) {
	own, err := Digest(def)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var header http.Header
		if req.Extra != nil {
			header = req.Extra.Header
		}
		pinned, epoch := header.Get(HeaderSchemaDigest), header.Get(HeaderEpoch)
		if g.verifier != nil {
			c, err := g.verifier.Verify(envelope.Presented{Envelope: header.Get(envelope.Header), Grant: header.Get(envelope.GrantHeader)}, envelope.Call{Tool: req.Params.Name, Arguments: req.Params.Arguments})
			if err != nil {
				// Verify refuses with an *envelope.Error, and nothing else.
				var e *envelope.Error
				if !errors.As(err, &e) {
					e = &envelope.Error{Reason: envelope.Invalid, Detail: err.Error()}
				}
				return nil, envelopeRefusal(def.Name, e)
			}
			pinned, epoch = c.SchemaDigest, c.Epoch
		}
		if pinned != own {
			return nil, refusal(def.Name, pinned, own, epoch)
		}
		return h(ctx, req)
	}, nil
}

// Wrap is NewGuard(nil).Wrap: the schema digest header only.
func Wrap(def *mcp.Tool, h mcp.ToolHandler) (mcp.ToolHandler, error) {
	return NewGuard(nil).Wrap(def, h)
}

func envelopeRefusal(tool string, e *envelope.Error) error {
	data, _ := json.Marshal(map[string]string{"reason": string(e.Reason), "tool": tool, "detail": e.Detail, "return_to": "none"})
	return &jsonrpc.Error{Code: CodeRefused, Message: fmt.Sprintf("tool %q refused at handler start: %s", tool, e), Data: data}
}

// Digest is the schema digest of def, as capsnap computes it.
func Digest(def *mcp.Tool) (string, error) {
	raw, err := json.Marshal(def)
	if err != nil {
		return "", fmt.Errorf("pincheck digest %s: %w", def.Name, err)
	}
	d, _, err := mcpparse.ToolDigest(raw)
	if err != nil {
		return "", fmt.Errorf("pincheck digest %s: %w", def.Name, err)
	}
	return d, nil
}

func refusal(tool, pinned, own, epoch string) error {
	data, _ := json.Marshal(map[string]string{
		"reason": Reason, "tool": tool, "pinned_digest": pinned, "handler_digest": own,
		"epoch": epoch, "return_to": "planning",
	})
	msg := fmt.Sprintf("tool %q refused at handler start: authorized for %q, handler serves %q", tool, pinned, own)
	if pinned == "" {
		msg = fmt.Sprintf("tool %q refused at handler start: the call carries no capsnap pin", tool)
	}
	return &jsonrpc.Error{Code: CodeRefused, Message: msg, Data: data}
}
