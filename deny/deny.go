// Package deny names the reasons capsnap refuses an MCP request.
//
// A Reason is at once the denial code sent to the caller, the audit record's
// "reason" and the value of the "reason" metric label, so the set is closed
// and every reason is made by a call to Errorf with one of the constants below.
package deny

import (
	"errors"
	"fmt"
)

// Reason is a stable, machine-readable cause of a denial.
type Reason string

const (
	// MalformedRequest: the body is not one strict JSON-RPC/MCP message (or
	// batch) that every parser reads the same way.
	MalformedRequest Reason = "malformed_request"
	// HeaderMismatch: an MCP header (Mcp-Method, Mcp-Name,
	// MCP-Protocol-Version) disagrees with the body, or names a version
	// capsnap does not speak.
	HeaderMismatch Reason = "header_mismatch"
	// UnsupportedEncoding: the body is compressed; capsnap never guesses at
	// what a decompressor upstream would see.
	UnsupportedEncoding Reason = "unsupported_encoding"
	// UnsupportedMediaType: the body is not declared as JSON.
	UnsupportedMediaType Reason = "unsupported_media_type"
	// NoPrincipal: the request carries no verified identity.
	NoPrincipal Reason = "no_principal"
	// UnknownServer: the route names no server_id capsnap is configured for.
	UnknownServer Reason = "unknown_server"
	// CatalogUnavailable: capsnap has no live view of the server's tools.
	CatalogUnavailable Reason = "catalog_unavailable"
	// UnknownTool: the tool is not in the server's live catalog.
	UnknownTool Reason = "unknown_tool"
	// UnclassifiedTool: the policy assigns the tool no effect class.
	UnclassifiedTool Reason = "unclassified_tool"
	// ToolNotGranted: the policy does not let this principal call the tool.
	ToolNotGranted Reason = "tool_not_granted"
)

// Error is a denial: a Reason and a human-readable detail for logs and the
// caller. It is the only error type the decision path returns to Envoy.
type Error struct {
	Reason Reason
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return string(e.Reason)
	}
	return string(e.Reason) + ": " + e.Detail
}

// Errorf returns a denial for reason r with a formatted detail.
func Errorf(r Reason, format string, args ...any) *Error {
	return &Error{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// As reports the denial inside err, if there is one.
func As(err error) (*Error, bool) {
	var d *Error
	ok := errors.As(err, &d)
	return d, ok
}
