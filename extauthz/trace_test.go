package extauthz

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/deny"
)

func TestDecisionSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	for _, tt := range []struct {
		name     string
		out      decide.Outcome
		span     string
		want     map[string]string
		excluded []string
	}{
		{"an allowed call", decide.Outcome{Method: "tools/call", Tool: "refund", ServerID: "billing", Epoch: "ep_1", Session: "S-1", ProtocolVersion: "2025-11-25", Principal: "agent"},
			"tools/call refund", map[string]string{
				"capsnap.decision": "allow", "capsnap.reason": "ok", "mcp.method.name": "tools/call", "gen_ai.tool.name": "refund",
				"gen_ai.operation.name": "execute_tool", "mcp.session.id": "S-1", "mcp.protocol.version": "2025-11-25", "capsnap.epoch": "ep_1",
			}, []string{"error.type", "capsnap.enforced"}},
		{"a denied call", decide.Outcome{Method: "tools/call", Tool: "refund", ServerID: "billing", Denial: deny.Errorf(deny.SchemaDrift, "changed")},
			"tools/call refund", map[string]string{"capsnap.decision": "deny", "capsnap.reason": "schema_drift", "error.type": "schema_drift"}, nil},
		{"an observed denial", decide.Outcome{Method: "tools/call", Tool: "wipe", ServerID: "billing", Observed: deny.Errorf(deny.ToolNotGranted, "no")},
			"tools/call wipe", map[string]string{"capsnap.decision": "allow", "capsnap.reason": "tool_not_granted", "capsnap.enforced": "false"}, []string{"error.type"}},
		{"a resource read: its uri names no span", decide.Outcome{Method: "resources/read", Name: "file:///secret/1234", ServerID: "billing"},
			"resources/read", map[string]string{"mcp.method.name": "resources/read"}, []string{"gen_ai.tool.name"}},
		{"a body capsnap could not read", decide.Outcome{Denial: deny.Errorf(deny.MalformedRequest, "x")},
			"capsnap.check", map[string]string{"capsnap.reason": "malformed_request"}, []string{"mcp.method.name"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, span := tracer.Start(context.Background(), "capsnap.check")
			decisionSpan(span, &tt.out)
			span.End()
			spans := rec.Ended()
			got := spans[len(spans)-1]
			if got.Name() != tt.span {
				t.Errorf("span %q, want %q", got.Name(), tt.span)
			}
			attrs := map[string]string{}
			for _, a := range got.Attributes() {
				attrs[string(a.Key)] = a.Value.String()
			}
			for k, v := range tt.want {
				if attrs[k] != v {
					t.Errorf("%s = %q, want %q (all: %v)", k, attrs[k], v, attrs)
				}
			}
			for _, k := range append(tt.excluded, "enduser.id", "capsnap.principal") {
				if _, ok := attrs[k]; ok {
					t.Errorf("%s is set: %v", k, attrs)
				}
			}
		})
	}
}
