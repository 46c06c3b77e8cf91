// Package decide is capsnap's decision core, and knows no proxy: it decides
// each MCP request of the streamable HTTP transport (Server.Decide), mints
// the snapshot over a tools/list's own answer (Server.Deliver) and screens
// every other answer for a listing on a stream not its own (Server.Screen).
// Packages extauthz and extproc adapt Envoy's external-authorization and
// external-processing APIs to it.
//
// One request reads top-down, a file a step: request.go parses the body,
// identifies the principal and routes the one message capsnap decides on;
// call.go decides a tools/call (snapshot, contract, rules, seal, record)
// and list.go a tools/list; Decide then answers (response.go) and audits
// (audit.go). The answers come back through delivery.go (a listing),
// stream.go (every other answer) and release.go (what a failed call gives
// back). What the decision decides with (the catalog, the store of record,
// the approvals, the envelope signer) are the ports of ports.go; the policy
// and lockfile in force are rules.go's, reloaded by reload.go, which puts a
// looser one in force on a person's acceptance, for every replica that
// shares the store. budgets.go reads and resets the budgets' counters for
// an operator.
package decide
