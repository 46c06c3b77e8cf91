package tracing

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/capsnap/capsnap/config"
)

func TestIncoming(t *testing.T) {
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tt := range []struct {
		name  string
		md    metadata.MD
		valid bool
	}{
		{"Envoy's traceparent", metadata.Pairs("traceparent", parent), true},
		{"no metadata", nil, false},
		{"a malformed traceparent", metadata.Pairs("traceparent", "00-xyz-01"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			if tt.md != nil {
				ctx = metadata.NewIncomingContext(ctx, tt.md)
			}
			sc := trace.SpanContextFromContext(Incoming(ctx))
			if sc.IsValid() != tt.valid {
				t.Fatalf("valid %v, want %v: %v", sc.IsValid(), tt.valid, sc)
			}
			if tt.valid && (sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sc.SpanID().String() != "00f067aa0ba902b7" || !sc.IsRemote() || !sc.IsSampled()) {
				t.Errorf("span context %v, want Envoy's, remote and sampled", sc)
			}
		})
	}
}

// Without an endpoint there is no tracer: the adapters make no spans.
func TestNewOff(t *testing.T) {
	tr, stop, err := New(context.Background(), config.Default().Tracing, "test")
	if err != nil || tr != nil {
		t.Fatalf("New = %v, %v; want no tracer", tr, err)
	}
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}
