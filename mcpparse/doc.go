// Package mcpparse reads MCP (Model Context Protocol) requests exactly as
// Envoy's ext_authz filter delivers them, and computes the canonical digests
// that identify a tool's contract.
//
// Parse takes the buffered body of one streamable-HTTP POST and its headers
// and returns the JSON-RPC 2.0 messages in it, or a *deny.Error. It is the
// security boundary between what capsnap decides on and what the MCP server
// will run, so it accepts only bodies that every parser reads the same way:
// strict I-JSON (RFC 7493) with no duplicate or case-colliding member names,
// strict JSON-RPC 2.0 message shapes, MCP's own rules for the protocol
// version in use, and MCP headers (MCP-Protocol-Version, Mcp-Method,
// Mcp-Name, Mcp-Session-Id) that agree with the body. Anything a more
// lenient parser downstream could read differently is refused rather than
// interpreted; the rules and the parser differential each one closes are
// documented where they are enforced.
//
// ToolDigest and ToolsDigests compute the schema digest of tool definitions:
// "sha256:" and the hex SHA-256 of the RFC 8785 (JCS) canonical form of the
// definition's governing fields. Serializer noise (member order, whitespace,
// escapes, number spelling) does not change a digest; any change to what
// the model or the server sees does. Test vectors are in
// testdata/digest/vectors.json.
package mcpparse
