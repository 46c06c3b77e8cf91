// Package extauthz is capsnap's decision core and its Envoy
// external-authorization adapter (envoy.service.auth.v3.Authorization): it
// decides each MCP request Envoy forwards with its body, and answers with an
// allow that pins what was verified into headers for the upstream, or a
// denial that an MCP client can read as a JSON-RPC error.
//
// The whole decision for one request is Server.evaluate, read top-down:
// parse the body, identify the principal, look the tool up in the live
// catalog, verify it against the policy, respond. The decision on a
// tools/list response, which package extproc adapts Envoy's ext_proc to, is
// Server.Deliver: it mints the snapshot over exactly what the agent is
// delivered and rewrites the response to exactly that.
package extauthz
