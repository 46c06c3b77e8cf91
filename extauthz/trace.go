package extauthz

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/capsnap/capsnap/decide"
)

// decisionSpan names span for the MCP request out decided and sets its
// attributes: the OpenTelemetry MCP and GenAI semantic conventions' (the
// method, the tool, the session, the protocol version), error.type for a
// denial, and capsnap's own (the decision, its reason, the server, the
// snapshot's epoch). The principal is not an attribute: traces are read
// more widely than the audit trail.
func decisionSpan(span trace.Span, out *decide.Outcome) {
	name := out.Method
	if out.Tool != "" {
		// A tool name is bounded by the catalogs; a resource's uri,
		// which Name may hold, is not, and stays out of span names.
		name += " " + out.Tool
	}
	if name == "" {
		name = "capsnap.check"
	}
	span.SetName(name)
	decision, reason := "allow", "ok"
	switch {
	case out.Denial != nil:
		decision, reason = "deny", string(out.Denial.Reason)
	case out.Observed != nil:
		reason = string(out.Observed.Reason)
	}
	attrs := []attribute.KeyValue{
		attribute.String("capsnap.decision", decision),
		attribute.String("capsnap.reason", reason),
		attribute.String("capsnap.server_id", out.ServerID),
	}
	if out.Method != "" {
		attrs = append(attrs, attribute.String("mcp.method.name", out.Method))
	}
	if out.ProtocolVersion != "" {
		attrs = append(attrs, attribute.String("mcp.protocol.version", out.ProtocolVersion))
	}
	if out.Session != "" {
		attrs = append(attrs, attribute.String("mcp.session.id", out.Session))
	}
	if out.Tool != "" {
		attrs = append(attrs, attribute.String("gen_ai.tool.name", out.Tool), attribute.String("gen_ai.operation.name", "execute_tool"))
	}
	if out.Epoch != "" {
		attrs = append(attrs, attribute.String("capsnap.epoch", out.Epoch))
	}
	if out.Denial != nil {
		attrs = append(attrs, attribute.String("error.type", reason))
	}
	if out.Observed != nil {
		attrs = append(attrs, attribute.Bool("capsnap.enforced", false))
	}
	span.SetAttributes(attrs...)
}
