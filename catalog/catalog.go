// Package catalog is capsnap's own live view of each upstream MCP server's
// tools. capsnap never takes a tool's definition from the request it is
// deciding: it keeps, per server, the last complete tools/list it fetched
// itself (as an MCP client, or from a static file), with the digest of
// every tool and when the list was fetched.
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

// Tool is one tool as the server last published it.
type Tool struct {
	Name string
	// Digest is the schema digest (mcpparse.ToolDigest) of the definition.
	Digest string
	// Definition is the canonical (RFC 8785) governing definition that was
	// hashed.
	Definition json.RawMessage
	// Since is the list generation in which this definition first appeared.
	Since uint64
}

// List is one immutable, complete view of a server's tools.
type List struct {
	ServerID string
	Tools    map[string]Tool // by name, unique within a server
	// FetchedAt is when the server last answered tools/list with this
	// content.
	FetchedAt time.Time
	// Generation increments each time the content changes.
	Generation uint64
}

// Status is how fresh a server's view is.
type Status struct {
	// Synced is true once a complete list has been fetched.
	Synced bool
	// FetchedAt is when the current list was last confirmed.
	FetchedAt time.Time
	// LastAttempt is the last fetch, successful or not; LastError is its
	// error, nil after a success.
	LastAttempt time.Time
	LastError   error
}

// Publish hands a Source's result to the catalog: the raw definitions of a
// complete tools/list, or the error that prevented one.
type Publish func(defs []json.RawMessage, err error)

// Source fetches one server's tools. Run publishes every complete list and
// every failure until ctx ends.
type Source interface {
	Run(ctx context.Context, publish Publish) error
}

// Options configure a Catalog.
type Options struct {
	Logger zerolog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// OnChange, if set, is called after a server's list changed, with the
	// names of the tools that were added, removed or redefined.
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
	// mu serializes publishes; state is read lock-free on the hot path.
	mu    sync.Mutex
	state atomic.Pointer[state]
}

type state struct {
	list   *List
	status Status
}

// New returns a catalog of the given sources, by server_id. Nothing is
// fetched until Run.
func New(sources map[string]Source, opts Options) *Catalog {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c := &Catalog{opts: opts, servers: map[string]*server{}}
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

// Run runs every source until ctx ends.
func (c *Catalog) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(c.servers))
	for _, s := range c.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.src.Run(ctx, func(defs []json.RawMessage, err error) { c.publish(s, defs, err) }); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("catalog %s: %w", s.id, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Lookup returns a server's current list and status. A server that is not
// configured, or has never been listed, is a catalog_unavailable denial:
// without a view of the tools nothing can be verified.
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
	now := c.opts.Now()
	prev := s.state.Load()
	next := &state{list: prev.list, status: prev.status}
	next.status.LastAttempt = now
	if err == nil {
		var list *List
		list, err = build(s.id, defs, prev.list, now)
		if err == nil {
			changed := diff(prev.list, list)
			if prev.list != nil && len(changed) == 0 {
				list = &List{ServerID: s.id, Tools: prev.list.Tools, FetchedAt: now, Generation: prev.list.Generation}
			}
			next.list = list
			next.status = Status{Synced: true, FetchedAt: now, LastAttempt: now}
			s.state.Store(next)
			if len(changed) > 0 {
				c.opts.Logger.Info().Str("server_id", s.id).Uint64("generation", list.Generation).
					Strs("changed", changed).Int("tools", len(list.Tools)).Msg("catalog changed")
				if c.opts.OnChange != nil {
					c.opts.OnChange(s.id, prev.list, list, changed)
				}
			}
			return
		}
	}
	next.status.LastError = err
	s.state.Store(next)
	c.opts.Logger.Warn().Str("server_id", s.id).Err(err).Msg("catalog refresh failed; keeping the last good list")
}

// build turns one published tools/list into a List. A list with a malformed
// definition or a name listed twice is refused whole: capsnap cannot know
// which of two same-named definitions a client would plan against.
func build(serverID string, defs []json.RawMessage, prev *List, now time.Time) (*List, error) {
	gen := uint64(1)
	if prev != nil {
		gen = prev.Generation + 1
	}
	l := &List{ServerID: serverID, Tools: make(map[string]Tool, len(defs)), FetchedAt: now, Generation: gen}
	for i, def := range defs {
		digest, canonical, err := mcpparse.ToolDigest(def)
		if err != nil {
			return nil, fmt.Errorf("tool %d: %w", i, err)
		}
		var id struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(canonical, &id); err != nil {
			return nil, fmt.Errorf("tool %d: %w", i, err)
		}
		if _, dup := l.Tools[id.Name]; dup {
			return nil, fmt.Errorf("tool %q is listed twice", id.Name)
		}
		t := Tool{Name: id.Name, Digest: digest, Definition: canonical, Since: gen}
		if p, ok := prev.tool(id.Name); ok && p.Digest == digest {
			t.Since = p.Since
		}
		l.Tools[id.Name] = t
	}
	return l, nil
}

func (l *List) tool(name string) (Tool, bool) {
	if l == nil {
		return Tool{}, false
	}
	t, ok := l.Tools[name]
	return t, ok
}

// diff names the tools added, removed or redefined between two lists, sorted.
func diff(prev, next *List) []string {
	var changed []string
	for name, t := range next.Tools {
		if p, ok := prev.tool(name); !ok || p.Digest != t.Digest {
			changed = append(changed, name)
		}
	}
	if prev != nil {
		for name := range prev.Tools {
			if _, ok := next.Tools[name]; !ok {
				changed = append(changed, name)
			}
		}
	}
	slices.Sort(changed)
	return changed
}
