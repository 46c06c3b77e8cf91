// Package decide is capsnap's decision core, and knows no proxy: it decides
// each MCP request of the streamable HTTP transport (Server.Decide), mints
// the snapshot over a tools/list's own answer (Server.Deliver) and screens
// every other answer for a listing on a stream not its own (Server.Screen).
// Packages extauthz and extproc adapt Envoy's external-authorization and
// external-processing APIs to it.
//
// The whole decision for one request is Server.evaluate, read top-down:
// parse the body, identify the principal, look the tool up in the live
// catalog, verify it against the policy (Rules.admit, then the policy's
// terms), respond with an Outcome.
package decide
