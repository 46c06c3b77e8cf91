package testbed

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// PrincipalHeader is the development header the stack's capsnap reads the
// principal from.
const PrincipalHeader = "x-capsnap-dev-principal"

// EpochHeader is where capsnap returns a snapshot's epoch, and where a
// client may name the epoch it planned under.
const EpochHeader = "x-capsnap-epoch"

// Agent is the HTTP side of an agent runtime: it names its principal on
// every request, remembers the epoch capsnap returned on its last
// tools/list, and sends whatever extra headers it is told to.
type Agent struct {
	Principal string

	mu    sync.Mutex
	epoch string
	send  map[string]string
}

// NewAgent returns an agent acting as principal.
func NewAgent(principal string) *Agent {
	return &Agent{Principal: principal, send: map[string]string{}}
}

// RoundTrip implements http.RoundTripper.
func (a *Agent) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(PrincipalHeader, a.Principal)
	a.mu.Lock()
	for k, v := range a.send {
		r.Header.Set(k, v)
	}
	a.mu.Unlock()
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil {
		if e := resp.Header.Get(EpochHeader); e != "" {
			a.mu.Lock()
			a.epoch = e
			a.mu.Unlock()
		}
	}
	return resp, err
}

// Epoch is the epoch of the agent's last tools/list.
func (a *Agent) Epoch() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.epoch
}

// Send makes the agent send header with value on every later request; an
// empty value stops it.
func (a *Agent) Send(header, value string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if value == "" {
		delete(a.send, header)
		return
	}
	a.send[header] = value
}

// HTTPClient returns a client that goes through the agent.
func (a *Agent) HTTPClient() *http.Client { return &http.Client{Transport: a} }

// HTTPClient returns a client that names principal on every request.
func HTTPClient(principal string) *http.Client { return NewAgent(principal).HTTPClient() }

// Connect opens an MCP session to url as principal, on the official Go SDK,
// speaking protocol version (empty for the SDK's default).
func Connect(ctx context.Context, url, principal, version string) (*mcp.ClientSession, error) {
	return NewAgent(principal).Connect(ctx, url, version)
}

// Connect opens an MCP session to url through the agent.
func (a *Agent) Connect(ctx context.Context, url, version string) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "capsnap-testbed", Version: "1"}, nil)
	t := &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: a.HTTPClient()}
	cs, err := c.Connect(ctx, t, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		return nil, fmt.Errorf("connect %s as %s: %w", url, a.Principal, err)
	}
	return cs, nil
}
