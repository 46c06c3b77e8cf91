// Package tracing is capsnap's OpenTelemetry tracing: a tracer provider
// that exports over OTLP/gRPC, and the W3C trace context Envoy sends on
// its gRPC calls to capsnap, so that a decision's span joins the trace of
// the request it decided. The adapters (extauthz, extproc) make the spans;
// the decision core knows nothing of them.
package tracing

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/capsnap/capsnap/config"
)

// ScopeName is the instrumentation scope of capsnap's spans.
const ScopeName = "github.com/capsnap/capsnap"

// New returns the tracer of c and the function that flushes and stops its
// exporter, or a nil tracer (tracing off) when c names no endpoint.
func New(ctx context.Context, c config.Tracing, version string) (trace.Tracer, func(context.Context) error, error) {
	if c.Endpoint == "" {
		return nil, func(context.Context) error { return nil }, nil
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(c.Endpoint)}
	if c.Insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	// The exporter connects lazily: a collector that is down costs the
	// spans, never a decision.
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		// Envoy decides whether a request is traced; capsnap follows it,
		// and samples SampleRatio of what it would start itself.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))),
		sdktrace.WithResource(resource.NewSchemaless(
			attribute.String("service.name", c.ServiceName),
			attribute.String("service.version", version),
		)),
	)
	return tp.Tracer(ScopeName), tp.Shutdown, nil
}

// Incoming returns ctx carrying the remote span of the W3C trace context
// (traceparent, tracestate) in ctx's incoming gRPC metadata: Envoy's span
// for its call to capsnap.
func Incoming(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	return propagation.TraceContext{}.Extract(ctx, carrier(md))
}

// carrier reads gRPC metadata as a propagation.TextMapCarrier; its keys
// are lower case, as W3C's header names are matched.
type carrier metadata.MD

func (c carrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c carrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

var _ propagation.TextMapCarrier = carrier(nil)
