package decide

import (
	"context"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
)

// Envoy is the adapter this package's tests drive the core through: the
// decision is tested as Envoy gets it, golden CheckResponses and all.
// Package extauthz imports this one, so these tests cannot import it; the
// external test file adapter_test.go sets Envoy to it before any test runs.
var Envoy func(*Server) authv3.AuthorizationServer

// ServerIDKey is extauthz.ServerIDKey, the context extension naming the
// route's server, which the tests' CheckRequests carry.
const ServerIDKey = "server_id"

// maxLogValue is extauthz's bound on a metadata value the request chose.
const maxLogValue = 256

// Check decides req through the Envoy adapter over f's core.
func (f *fixture) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return f.envoy.Check(ctx, req)
}
