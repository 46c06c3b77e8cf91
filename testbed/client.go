package testbed

import (
	"context"
	"fmt"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// PrincipalHeader is the development header the stack's capsnap reads the
// principal from.
const PrincipalHeader = "x-capsnap-dev-principal"

// headerTransport adds fixed headers to every request, as an agent runtime
// or a sidecar would.
type headerTransport struct {
	base    http.RoundTripper
	headers http.Header
}

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, vs := range t.headers {
		r.Header[k] = vs
	}
	return t.base.RoundTrip(r)
}

// HTTPClient returns a client that names principal on every request.
func HTTPClient(principal string) *http.Client {
	h := http.Header{}
	h.Set(PrincipalHeader, principal)
	return &http.Client{Transport: headerTransport{base: http.DefaultTransport, headers: h}}
}

// Connect opens an MCP session to url as principal, on the official Go SDK,
// speaking protocol version (empty for the SDK's default).
func Connect(ctx context.Context, url, principal, version string) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "capsnap-testbed", Version: "1"}, nil)
	t := &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: HTTPClient(principal)}
	cs, err := c.Connect(ctx, t, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		return nil, fmt.Errorf("connect %s as %s: %w", url, principal, err)
	}
	return cs, nil
}
