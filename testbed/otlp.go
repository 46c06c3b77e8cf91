package testbed

import (
	"context"
	"encoding/hex"
	"net"
	"strings"
	"sync"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// Collector is an OTLP/gRPC trace receiver on loopback: the endpoint Envoy's
// OpenTelemetry tracer and capsnap both export to, which keeps every span
// it is sent.
type Collector struct {
	collectortrace.UnimplementedTraceServiceServer
	addr string
	srv  *grpc.Server

	mu    sync.Mutex
	spans []Span
}

// Span is a received span: its service's name, its ids (hex), name and
// string attributes.
type Span struct {
	Service                       string
	TraceID, SpanID, ParentSpanID string
	Name                          string
	Attributes                    map[string]string
}

// StartCollector listens on a free loopback port.
func StartCollector() (*Collector, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &Collector{addr: lis.Addr().String(), srv: grpc.NewServer()}
	collectortrace.RegisterTraceServiceServer(c.srv, c)
	go func() { _ = c.srv.Serve(lis) }()
	return c, nil
}

// Addr is the collector's host:port.
func (c *Collector) Addr() string { return c.addr }

// Port is the collector's port.
func (c *Collector) Port() string { return c.addr[strings.LastIndexByte(c.addr, ':')+1:] }

// Stop stops the collector.
func (c *Collector) Stop() { c.srv.Stop() }

// Spans are the spans received so far.
func (c *Collector) Spans() []Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Span(nil), c.spans...)
}

// Export implements collectortrace.TraceServiceServer.
func (c *Collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				attrs := map[string]string{}
				for _, a := range s.GetAttributes() {
					attrs[a.GetKey()] = a.GetValue().GetStringValue()
				}
				c.spans = append(c.spans, Span{
					Service: service, Name: s.GetName(), Attributes: attrs,
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()),
				})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// TracingEnvoyConfig is EnvoyConfig(p) with Envoy's OpenTelemetry tracer
// on, sampling every request and exporting to the collector at port: the
// snippet docs/OPERATIONS.md shows, in place.
func TracingEnvoyConfig(p Ports, port string) []byte {
	cfg := string(EnvoyConfig(p))
	cfg = strings.Replace(cfg, "          stat_prefix: mcp\n", `          stat_prefix: mcp
          tracing:
            random_sampling: {value: 100}
            provider:
              name: envoy.tracers.opentelemetry
              typed_config:
                "@type": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                grpc_service: {envoy_grpc: {cluster_name: otlp}, timeout: 1s}
                service_name: envoy
`, 1)
	cfg = strings.Replace(cfg, "  clusters:\n", `  clusters:
  - name: otlp
    type: STATIC
    connect_timeout: 0.25s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {}
    load_assignment:
      cluster_name: otlp
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: `+port+`}
`, 1)
	return []byte(cfg)
}
