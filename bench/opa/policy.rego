# The OPA-Envoy peer of make bench: the decision capsnap makes for an
# allowed MCP tools/call, written in Rego as an operator would write it,
# so that the two can be measured on the same CheckRequest.
#
# It does what the benchmark's request needs and no more: parse the
# JSON-RPC body, require tools/call, find the snapshot the caller names in
# x-capsnap-epoch, check that it is this principal's and that its pinned
# digest for the tool is the live catalog's, then the policy's grant,
# effect ceiling, capabilities, the USD 250 cap and the reason allowlist
# (examples/demo/policy.yaml). It does not validate the arguments against
# the tool's JSON Schema, and it has no sequence rule (OPA holds no state
# per snapshot), both of which capsnap does: the comparison favours OPA.
package capsnap.authz

default allow := false

http := input.attributes.request.http

body := input.parsed_body

principal := input.attributes.source.principal

server := input.attributes.contextExtensions.server_id

tool := body.params.name

args := body.params.arguments

snapshot := data.capsnap.snapshots[http.headers["x-capsnap-epoch"]]

effect_rank := {"read": 0, "write": 1, "money_move": 2, "admin": 3}

allow if {
	body.jsonrpc == "2.0"
	body.method == "tools/call"
	is_string(tool)
	is_object(args)

	# The snapshot is this principal's, for this server, and pins the tool
	# at the digest the server serves now.
	snapshot.principal == principal
	snapshot.server == server
	snapshot.pins[tool] == data.capsnap.catalog[server][tool]

	# The policy classifies the tool and grants it to the principal.
	rule := data.capsnap.policy.tools[server][tool]
	grant := data.capsnap.policy.principals[principal].grants[server]
	tool in grant.tools
	effect_rank[rule.effect] <= effect_rank[grant.max_effect]
	every c in rule.capabilities {
		c in grant.capabilities
	}

	amount_ok(rule)
	reason_ok(rule)
}

amount_ok(rule) if not rule.max_amount

amount_ok(rule) if {
	is_number(args.amount)
	args.amount <= rule.max_amount
}

reason_ok(rule) if not rule.reasons

reason_ok(rule) if args.reason_code in rule.reasons
