// Package pincheck lets an MCP server built on the official Go SDK verify,
// at handler start, that the call capsnap authorized is a call to the tool
// definition this handler serves.
//
// capsnap pins the schema digest it verified into the x-capsnap-schema-digest
// header of an allowed tools/call. Between that decision and the handler's
// first line the server can still redeploy; pincheck closes that window by
// comparing the pin with the digest of the handler's own definition, and
// refusing the call before any side effect if they differ or the pin is
// missing.
package pincheck

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

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

// Wrap returns h guarded by a check that the request's pinned schema digest
// is the digest of def, the definition h is registered with. Register the
// result with the same def: srv.AddTool(def, pincheck.Wrap(def, h)).
func Wrap(def *mcp.Tool, h mcp.ToolHandler) (mcp.ToolHandler, error) {
	own, err := Digest(def)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var pinned, epoch string
		if req.Extra != nil && req.Extra.Header != nil {
			pinned = req.Extra.Header.Get(HeaderSchemaDigest)
			epoch = req.Extra.Header.Get(HeaderEpoch)
		}
		if pinned != own {
			return nil, refusal(def.Name, pinned, own, epoch)
		}
		return h(ctx, req)
	}, nil
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
