package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"
)

// MCPSource keeps a server's tools current as an MCP client on the official
// Go SDK: it connects, lists every page, relists on
// notifications/tools/list_changed (the GET event stream in the 2025
// versions, subscriptions/listen in 2026-07-28) and on a timer as a
// backstop, and reconnects with backoff when the server goes away.
type MCPSource struct {
	// URL is the server's streamable HTTP endpoint.
	URL string
	// ProtocolVersion is the MCP version to speak; empty lets the SDK pick.
	ProtocolVersion string
	// Resync is the backstop relist interval.
	Resync time.Duration
	// HTTPClient, if set, is used for every request.
	HTTPClient *http.Client
	// MinBackoff and MaxBackoff bound the wait before reconnecting; zero
	// means 100ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	Logger                 zerolog.Logger
}

var _ Source = (*MCPSource)(nil)

// Run implements Source.
func (s *MCPSource) Run(ctx context.Context, publish Publish) error {
	minB, maxB := s.MinBackoff, s.MaxBackoff
	if minB <= 0 {
		minB = 100 * time.Millisecond
	}
	if maxB <= 0 {
		maxB = 10 * time.Second
	}
	backoff := minB
	for {
		listed, err := s.session(ctx, publish)
		if ctx.Err() != nil {
			return nil
		}
		if listed {
			backoff = minB
		}
		publish(nil, err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxB)
	}
}

// session connects once and keeps the list current until the connection
// fails. listed reports whether it published at least one list.
func (s *MCPSource) session(ctx context.Context, publish Publish) (listed bool, err error) {
	// One pending relist is enough however many notifications arrive: a
	// storm of list_changed costs one tools/list, not one each.
	changed := make(chan struct{}, 1)
	client := mcp.NewClient(&mcp.Implementation{Name: "capsnap-catalog", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case changed <- struct{}{}:
			default:
			}
		},
	})
	t := &mcp.StreamableClientTransport{Endpoint: s.URL, HTTPClient: s.HTTPClient}
	cs, err := client.Connect(ctx, t, &mcp.ClientSessionOptions{ProtocolVersion: s.ProtocolVersion})
	if err != nil {
		return false, fmt.Errorf("connect %s: %w", s.URL, err)
	}
	defer cs.Close()
	closed := make(chan error, 1)
	go func() { closed <- cs.Wait() }()

	resync := time.NewTicker(s.Resync)
	defer resync.Stop()
	for {
		defs, err := listAll(ctx, cs)
		if err != nil {
			return listed, err
		}
		publish(defs, nil)
		listed = true
		select {
		case <-ctx.Done():
			return listed, nil
		case err := <-closed:
			if err == nil {
				err = errors.New("session closed")
			}
			return listed, fmt.Errorf("%s: %w", s.URL, err)
		case <-changed:
			s.Logger.Debug().Str("url", s.URL).Msg("tools/list_changed: relisting")
		case <-resync.C:
		}
	}
}

// listAll fetches every page of tools/list.
func listAll(ctx context.Context, cs *mcp.ClientSession) ([]json.RawMessage, error) {
	var defs []json.RawMessage
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("tools/list: %w", err)
		}
		raw, err := json.Marshal(tool)
		if err != nil {
			return nil, fmt.Errorf("tools/list: %w", err)
		}
		defs = append(defs, raw)
	}
	return defs, nil
}
