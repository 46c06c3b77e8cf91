// Package catalog is capsnap's own live view of each upstream MCP server's
// tools.
//
// capsnap never takes a tool's definition from the request it is deciding:
// it keeps, per server, the last complete tools/list it fetched itself (as an
// MCP client with MCPSource, or from a static file with FileSource), with the
// schema digest of every tool, when the list was fetched and whether the
// latest attempt to refresh it failed. Deciding whether a list is fresh
// enough for a given call is the caller's business; the catalog only keeps
// the facts straight and never publishes a partial list.
package catalog

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/mcpparse"
)

// Tool is one tool as its server last published it.
type Tool struct {
	Name string
	// Digest is the schema digest (mcpparse.ToolDigest) of the definition.
	Digest string
	// Definition is the canonical (RFC 8785) governing definition that was
	// hashed: exactly the bytes Digest covers.
	Definition json.RawMessage
	// InputSchema is the inputSchema member of Definition, nil if the
	// definition has none.
	InputSchema json.RawMessage
}

// List is one immutable, complete view of a server's tools. Callers must not
// modify it: every Lookup returns the same value until the next fetch.
type List struct {
	ServerID string
	// Tools is keyed by name, which is unique within a server.
	Tools map[string]Tool
	// FetchedAt is when the server last answered tools/list with this
	// content.
	FetchedAt time.Time
	// Generation starts at 1 and increments each time the content changes;
	// a refetch of the same content keeps it.
	Generation uint64
}

// Status is how fresh a server's view is.
type Status struct {
	// Synced is true once a complete list has been fetched.
	Synced bool
	// FetchedAt is when the current list was last confirmed.
	FetchedAt time.Time
	// LastAttempt is the latest fetch, successful or not, and LastError its
	// error: nil after a success. A failed refresh keeps the last good list.
	LastAttempt time.Time
	LastError   error
}

// Publish hands the catalog the outcome of one fetch: every tool definition
// of a complete tools/list (all pages), as JSON, or the error that kept the
// source from getting one.
type Publish func(defs []json.RawMessage, err error)

// Source fetches one server's tools.
type Source interface {
	// Run publishes every complete list and every failed attempt until ctx
	// ends, then returns nil. It returns an error only when it cannot run at
	// all, such as when it is misconfigured.
	Run(ctx context.Context, publish Publish) error
}

var (
	_ Source = (*MCPSource)(nil)
	_ Source = (*FileSource)(nil)
)

// Options configure a Catalog.
type Options struct {
	Logger zerolog.Logger
	// Clock stamps fetches; nil means time.Now.
	Clock func() time.Time
	// OnChange, if set, is called each time a server's list gets a new
	// generation (its first list included, with prev nil), with the names
	// of the tools added, removed or whose digest changed, sorted. Calls for
	// one server are made one at a time and in generation order, from that
	// server's source goroutine, so OnChange should return quickly.
	OnChange func(serverID string, prev, next *List, changed []string)
}

// Catalog holds the latest list and status of every configured server.
type Catalog struct {
	opts    Options
	servers map[string]*server
}

type server struct {
	id  string
	src Source
	// mu serializes publishes, so that generations and OnChange calls are
	// ordered; readers load state without it.
	mu    sync.Mutex
	state atomic.Pointer[state]
	// Counted for the metrics collector.
	refreshOK, refreshErr, listChanged atomic.Uint64
}

type state struct {
	list   *List
	status Status
}

// New returns a catalog of the given sources, keyed by server_id. Nothing is
// fetched until Run.
func New(sources map[string]Source, opts Options) *Catalog {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	c := &Catalog{opts: opts, servers: make(map[string]*server, len(sources))}
	for id, src := range sources {
		s := &server{id: id, src: src}
		s.state.Store(&state{})
		c.servers[id] = s
	}
	return c
}

// Servers lists the configured server_ids, sorted.
func (c *Catalog) Servers() []string {
	ids := make([]string, 0, len(c.servers))
	for id := range c.servers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Run runs every source until ctx ends and returns nil then; call it once.
// If a source cannot run at all, Run stops the others and returns that
// error: a misconfigured server should stop capsnap at startup, not leave it
// denying quietly.
func (c *Catalog) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg      sync.WaitGroup
		once    sync.Once
		failure error
	)
	for _, s := range c.servers {
		wg.Go(func() {
			if err := s.src.Run(ctx, func(defs []json.RawMessage, err error) { c.publish(s, defs, err) }); err != nil {
				err = fmt.Errorf("catalog %s: %w", s.id, err)
				c.publish(s, nil, err)
				once.Do(func() { failure = err })
				cancel()
			}
		})
	}
	wg.Wait()
	return failure
}

// Lookup returns a server's current list and status. A server that is not
// configured, or has never been listed, is a catalog_unavailable denial:
// without a view of its tools nothing can be verified. Once listed, the last
// good list is returned even when later refreshes failed; Status says so.
func (c *Catalog) Lookup(serverID string) (*List, Status, error) {
	s, ok := c.servers[serverID]
	if !ok {
		return nil, Status{}, deny.Errorf(deny.CatalogUnavailable, "server %q is not configured", serverID)
	}
	st := s.state.Load()
	if st.list == nil {
		if st.status.LastError != nil {
			return nil, st.status, deny.Errorf(deny.CatalogUnavailable, "server %q has never been listed: %v", serverID, st.status.LastError)
		}
		return nil, st.status, deny.Errorf(deny.CatalogUnavailable, "server %q has not been listed yet", serverID)
	}
	return st.list, st.status, nil
}

func (c *Catalog) publish(s *server, defs []json.RawMessage, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := c.opts.Clock()
	prev := s.state.Load()
	next := &state{list: prev.list, status: prev.status}
	next.status.LastAttempt = now
	var tools map[string]Tool
	if err == nil {
		tools, err = parseTools(defs)
	}
	if err != nil {
		s.refreshErr.Add(1)
		next.status.LastError = err
		s.state.Store(next)
		c.opts.Logger.Warn().Str("server_id", s.id).Err(err).Bool("synced", next.list != nil).
			Msg("catalog refresh failed; keeping the last good list")
		return
	}

	s.refreshOK.Add(1)
	next.status = Status{Synced: true, FetchedAt: now, LastAttempt: now}
	changed := diff(prev.list, tools)
	if prev.list != nil && len(changed) == 0 {
		// The same content again: only its freshness moves.
		next.list = &List{ServerID: s.id, Tools: prev.list.Tools, FetchedAt: now, Generation: prev.list.Generation}
		s.state.Store(next)
		return
	}
	var gen uint64 = 1
	if prev.list != nil {
		gen = prev.list.Generation + 1
	}
	next.list = &List{ServerID: s.id, Tools: tools, FetchedAt: now, Generation: gen}
	s.state.Store(next)
	c.opts.Logger.Info().Str("server_id", s.id).Uint64("generation", gen).
		Strs("changed", changed).Int("tools", len(tools)).Msg("catalog changed")
	if c.opts.OnChange != nil {
		c.opts.OnChange(s.id, prev.list, next.list, changed)
	}
}

// parseTools digests one published tools/list. A list with a malformed
// definition or a name listed twice is refused whole: capsnap cannot know
// which of two same-named definitions a client would plan against.
func parseTools(defs []json.RawMessage) (map[string]Tool, error) {
	tools := make(map[string]Tool, len(defs))
	for i, def := range defs {
		digest, canonical, err := mcpparse.ToolDigest(def)
		if err != nil {
			return nil, fmt.Errorf("read tools/list: tool %d: %w", i, err)
		}
		var gov struct {
			Name        string          `json:"name"`
			InputSchema json.RawMessage `json:"inputSchema"`
		}
		if err := json.Unmarshal(canonical, &gov); err != nil {
			return nil, fmt.Errorf("read tools/list: tool %d: %w", i, err)
		}
		if _, dup := tools[gov.Name]; dup {
			return nil, fmt.Errorf("read tools/list: tool %q is listed twice", gov.Name)
		}
		tools[gov.Name] = Tool{Name: gov.Name, Digest: digest, Definition: canonical, InputSchema: gov.InputSchema}
	}
	return tools, nil
}

func (l *List) tool(name string) (Tool, bool) {
	if l == nil {
		return Tool{}, false
	}
	t, ok := l.Tools[name]
	return t, ok
}

// diff names the tools added, removed or redefined since prev, sorted.
func diff(prev *List, next map[string]Tool) []string {
	var changed []string
	for name, t := range next {
		if p, ok := prev.tool(name); !ok || p.Digest != t.Digest {
			changed = append(changed, name)
		}
	}
	if prev != nil {
		for name := range prev.Tools {
			if _, ok := next[name]; !ok {
				changed = append(changed, name)
			}
		}
	}
	slices.Sort(changed)
	return changed
}
