package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"
)

// Defaults of an MCPSource's zero fields.
const (
	DefaultResync     = 30 * time.Second
	DefaultTimeout    = 10 * time.Second
	DefaultMaxBackoff = 30 * time.Second
)

// minBackoff is the first reconnect delay. It is short because most losses
// are a redeploy, and a server that is back is best relisted at once.
const minBackoff = 100 * time.Millisecond

// statelessVersion is the first MCP version without sessions, where
// list_changed arrives on a subscriptions/listen stream rather than on the
// GET stream of a session.
const statelessVersion = "2026-07-28"

// MCPSource keeps one server's list with an MCP client (the official Go SDK)
// over streamable HTTP. It connects, lists every page of tools and publishes
// them; it relists on notifications/tools/list_changed (a storm of which
// coalesces into one relist at a time) and every Resync as a backstop. When
// the connection, or the stream list_changed arrives on, is lost, it
// reconnects with bounded exponential backoff and relists, so a change made
// while it was away is not missed.
//
// On 2025-06-18 and 2025-11-25 list_changed arrives on the session's GET
// stream; on 2026-07-28 the SDK opens a subscriptions/listen stream, and
// MCPSource waits for the server's acknowledgement before its first list so
// that no change falls between the two. The ttlMs of a 2026-07-28
// tools/list result is ignored: every relist asks the server (see
// freshLists).
//
// The digests are over each tool as the SDK decoded it and encodes it back,
// which is what an agent on the same SDK is shown and what the server's own
// handler computes (package pincheck); JCS removes serializer noise.
type MCPSource struct {
	// URL is the server's streamable HTTP endpoint.
	URL string
	// ProtocolVersion is the MCP version to ask for; empty means the SDK's
	// latest. The server may negotiate an older one.
	ProtocolVersion string
	// Resync is the backstop relist interval; zero means DefaultResync.
	Resync time.Duration
	// Timeout bounds connecting and each complete listing; zero means
	// DefaultTimeout.
	Timeout time.Duration
	// MaxBackoff caps the delay between reconnects; zero means
	// DefaultMaxBackoff.
	MaxBackoff time.Duration
	// HTTPClient carries the requests; nil means a client of its own. It
	// must have no Timeout, which would cut the notification streams.
	HTTPClient *http.Client
	// Capabilities are the client capabilities the session declares
	// (config.ClientCapabilityNames): servers may offer some tools only to
	// sessions that declare one, and capsnap must see every tool any agent
	// can be delivered. Requests the server then sends (sampling,
	// elicitation) are refused: capsnap has no model and no user.
	Capabilities []string
	// OnListChanged, if set, is called for every
	// notifications/tools/list_changed, before the relist it triggers;
	// the metrics count them with Catalog.NoteListChanged.
	OnListChanged func()
	// Logger records connections and their loss; give it the server_id.
	Logger zerolog.Logger
}

// Run keeps the list until ctx ends.
func (s *MCPSource) Run(ctx context.Context, publish Publish) error {
	if err := s.check(); err != nil {
		return err
	}
	hc := s.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		defer hc.CloseIdleConnections()
	}
	log := s.Logger.With().Str("url", s.URL).Logger()
	delay := minBackoff
	for {
		synced, err := s.session(ctx, hc, log, publish)
		if ctx.Err() != nil {
			return nil
		}
		publish(nil, err)
		if synced {
			delay = minBackoff
		}
		wait := delay/2 + rand.N(delay/2+1)
		log.Warn().Err(err).Int64("retry_in_ms", wait.Milliseconds()).Msg("catalog source failed; reconnecting")
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		delay = min(2*delay, orDefault(s.MaxBackoff, DefaultMaxBackoff))
	}
}

func (s *MCPSource) check() error {
	u, err := url.Parse(s.URL)
	if err != nil {
		return fmt.Errorf("mcp source: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("mcp source: url %q is not an http(s) URL", s.URL)
	}
	if v := s.ProtocolVersion; v != "" && !slices.Contains(mcp.SupportedProtocolVersions(), v) {
		return fmt.Errorf("mcp source: protocol version %q is not one of %v", v, mcp.SupportedProtocolVersions())
	}
	if s.HTTPClient != nil && s.HTTPClient.Timeout != 0 {
		return errors.New("mcp source: the HTTP client has a Timeout, which would cut the list_changed stream")
	}
	return nil
}

// session connects once and keeps the list until the connection is lost or
// ctx ends. synced reports whether it published a list, so that a server
// that comes and goes is retried quickly rather than ever more slowly.
func (s *MCPSource) session(ctx context.Context, hc *http.Client, log zerolog.Logger, publish Publish) (synced bool, err error) {
	changed := make(chan struct{}, 1)
	acked := make(chan struct{})
	var ackOnce sync.Once
	client := mcp.NewClient(&mcp.Implementation{Name: "capsnap-catalog", Version: "1"}, s.clientOptions(&mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			if s.OnListChanged != nil {
				s.OnListChanged()
			}
			select {
			case changed <- struct{}{}:
			default: // a relist is already due and will see this change too
			}
		},
	}))
	client.AddSendingMiddleware(freshLists)
	client.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "notifications/subscriptions/acknowledged" {
				ackOnce.Do(func() { close(acked) })
			}
			return next(ctx, method, req)
		}
	})
	watch := &listenWatch{base: hc.Transport, ended: make(chan struct{})}
	if watch.base == nil {
		watch.base = http.DefaultTransport
	}
	raw := &rawLists{base: watch}
	whc := *hc
	whc.Transport = raw
	transport := &mcp.StreamableClientTransport{
		Endpoint:   s.URL,
		HTTPClient: &whc,
		// Any break of the GET stream ends the session at once: the SDK's
		// own retries would resume it without the notifications sent in
		// between, while a new session relists.
		MaxRetries: -1,
	}

	timeout := orDefault(s.Timeout, DefaultTimeout)
	cctx, cancel := context.WithTimeout(ctx, timeout)
	cs, err := client.Connect(cctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: s.ProtocolVersion})
	cancel()
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	var waitErr error
	closed := make(chan struct{})
	go func() {
		waitErr = cs.Wait()
		close(closed)
	}()
	defer func() {
		_ = cs.Close()
		<-closed
	}()

	res := cs.InitializeResult()
	listens := res.Capabilities != nil && res.Capabilities.Tools != nil && res.Capabilities.Tools.ListChanged
	log.Info().Str("protocol_version", res.ProtocolVersion).Str("session_id", cs.ID()).Bool("list_changed", listens).
		Msg("catalog connected")
	if !listens {
		log.Warn().Msg("server does not announce tools list_changed; relying on the resync timer")
	}
	if listens && res.ProtocolVersion >= statelessVersion {
		t := time.NewTimer(timeout)
		select {
		case <-acked:
			t.Stop()
		case <-watch.ended:
			t.Stop()
			return false, errors.New("subscriptions/listen stream refused")
		case <-t.C:
			return false, errors.New("subscriptions/listen not acknowledged in time")
		case <-ctx.Done():
			t.Stop()
			return false, nil
		}
	}

	resync := orDefault(s.Resync, DefaultResync)
	tick := time.NewTicker(resync)
	defer tick.Stop()
	for {
		lctx, cancel := context.WithTimeout(ctx, timeout)
		defs, err := listTools(lctx, cs, raw)
		cancel()
		if err != nil {
			return synced, fmt.Errorf("list tools: %w", err)
		}
		publish(defs, nil)
		synced = true
		tick.Reset(resync)
		select {
		case <-ctx.Done():
			return true, nil
		case <-closed:
			return true, fmt.Errorf("connection closed: %w", waitErr)
		case <-watch.ended:
			return true, errors.New("subscriptions/listen stream ended")
		case <-changed:
		case <-tick.C:
		}
	}
}

// clientOptions declares what s.Capabilities names. The SDK declares
// sampling and elicitation whenever their handlers are set, so a handler is
// set only for a capability that is declared.
func (s *MCPSource) clientOptions(o *mcp.ClientOptions) *mcp.ClientOptions {
	o.Capabilities = &mcp.ClientCapabilities{}
	for _, c := range s.Capabilities {
		switch c {
		case "roots":
			// Deprecated by 2026-07-28, and still what a server keys
			// tools on for older clients: declared for the widest view.
			//lint:ignore SA1019 capsnap declares what servers key tools on
			o.Capabilities.RootsV2 = &mcp.RootCapabilities{ListChanged: true}
		case "sampling":
			//lint:ignore SA1019 capsnap declares what servers key tools on
			o.CreateMessageHandler = refuseSampling
		case "elicitation":
			// Both modes: a server may offer a tool only to clients that
			// can take a URL elicitation.
			o.ElicitationHandler = refuseElicitation
			o.Capabilities.Elicitation = &mcp.ElicitationCapabilities{Form: &mcp.FormElicitationCapabilities{}, URL: &mcp.URLElicitationCapabilities{}}
		}
	}
	return o
}

//lint:ignore SA1019 the handler of a capability declared above
func refuseSampling(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	return nil, errors.New("capsnap's catalog session has no model to sample")
}

func refuseElicitation(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	return &mcp.ElicitResult{Action: "decline"}, nil
}

// freshLists keeps the SDK from caching tools/list results, by zeroing the
// ttlMs of each before ClientSession.ListTools stores it. A cached list
// would outlive the change that made it stale: a list_changed that arrives
// while a relist is in flight empties the cache before that relist's answer,
// made before the change, is stored in it, so the relist that list_changed
// asked for, and every backstop relist for ttlMs after it, would be answered
// with the old list.
func freshLists(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if r, ok := res.(*mcp.ListToolsResult); ok && r != nil {
			r.TTLMs = 0
		}
		return res, err
	}
}

// listTools fetches every page of tools/list, each tool as the server
// wrote it (raw).
func listTools(ctx context.Context, cs *mcp.ClientSession, raw *rawLists) ([]json.RawMessage, error) {
	var defs []json.RawMessage
	seen := map[string]bool{}
	params := &mcp.ListToolsParams{}
	for {
		res, err := cs.ListTools(ctx, params)
		if err != nil {
			return nil, err
		}
		page, err := raw.definitions(res)
		if err != nil {
			return nil, err
		}
		defs = append(defs, page...)
		if res.NextCursor == "" {
			return defs, nil
		}
		if seen[res.NextCursor] {
			return nil, fmt.Errorf("cursor %q came back: the pages loop", res.NextCursor)
		}
		seen[res.NextCursor] = true
		params = &mcp.ListToolsParams{Cursor: res.NextCursor}
	}
}

// listenWatch closes ended when the 2026-07-28 subscriptions/listen stream
// is refused or ends. The SDK opens that stream without waiting for it and
// never reports its loss, after which list_changed would go unheard.
type listenWatch struct {
	base  http.RoundTripper
	once  sync.Once
	ended chan struct{}
}

func (w *listenWatch) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := w.base.RoundTrip(req)
	if req.Header.Get("Mcp-Method") != "subscriptions/listen" {
		return resp, err
	}
	if err != nil || resp.StatusCode/100 != 2 {
		w.end()
		return resp, err
	}
	resp.Body = &watchedBody{ReadCloser: resp.Body, end: w.end}
	return resp, nil
}

func (w *listenWatch) end() { w.once.Do(func() { close(w.ended) }) }

type watchedBody struct {
	io.ReadCloser
	end func()
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.end()
	}
	return n, err
}

func (b *watchedBody) Close() error {
	b.end()
	return b.ReadCloser.Close()
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
