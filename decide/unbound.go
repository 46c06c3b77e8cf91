package decide

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/store"
)

// A tools/list capsnap allows on the response path issues a listing ticket,
// and the response is meant to come back through Envoy's ext_proc filter
// with it (Deliver). If Envoy runs ext_authz without that filter, or skips
// it on a route, nothing fails where capsnap can see it: the agent gets the
// server's whole list, unfiltered, and every call it plans is denied
// no_snapshot. So capsnap watches the tickets it issues, and a ticket not
// redeemed within unboundAfter is a listing whose response never came back:
// counted (capsnap_delivery_unbound_total), logged once per server, and
// reported on /readyz.
//
// Envoy may send a listing's Check to one replica and its response to
// another. A replica that redeems a ticket it is not watching records it
// in the shared store (store.Redemptions), and the replica that issued it
// asks there before it counts the ticket.

const (
	// unboundAfter is how long a response may take to come back: far
	// longer than a tools/list takes, far shorter than an operator would
	// go on wondering why every call is denied.
	unboundAfter = 5 * time.Second
	// sweepEvery is how often due tickets are decided.
	sweepEvery = time.Second
	// unboundReported is how long after a server's last unbound listing
	// /readyz still reports it: the window of the alert in
	// examples/prometheus/alerts.yaml.
	unboundReported = 10 * time.Minute
	// maxWatched bounds the tickets watched at once. A flood of tools/list
	// on a broken response path fills it for unboundAfter at most; the
	// tickets issued meanwhile go unwatched, and the sample already says
	// what is wrong.
	maxWatched = 1 << 16
	// maxRemote bounds the redemptions waiting to be written to the shared
	// store; past it they are dropped, and the issuing replica may count
	// a listing as unbound that was not.
	maxRemote = 1 << 14
	// redemptionKept is how long a redemption stays in the shared store:
	// past the issuing replica's last sweep of the ticket.
	redemptionKept = 2 * unboundAfter
)

// ticketID names a ticket: the first 16 characters of its MAC's base64, 96
// bits that no two tickets of one key share by chance. Taken from the
// ticket's text, so that watching one costs a copy, not a decode.
type ticketID [16]byte

func ticketIDOf(ticket string) (ticketID, bool) {
	var id ticketID
	_, mac, ok := strings.Cut(ticket, ".")
	if !ok || len(mac) < len(id) {
		return id, false
	}
	copy(id[:], mac)
	return id, true
}

// unbound watches the listing tickets this replica issued until they
// come back.
type unbound struct {
	// shared is the store the replicas share, if it records redemptions.
	shared store.Redemptions
	// paths are the configured servers', fixed at New: a route naming any
	// other is denied before a ticket is issued.
	paths map[string]*responsePath
	order []string
	wake  chan struct{}

	mu sync.Mutex
	// watched are the tickets issued here and not yet redeemed, and queue
	// the same in the order they fall due: a sweep reads only the front.
	watched map[ticketID]*responsePath
	queue   []due
	// remote are the tickets redeemed here that this replica is not
	// watching, for the shared store: another replica issued them (or
	// this one, and its sweep has decided them already).
	remote []string
}

type due struct {
	id     ticketID
	issued time.Time
}

// responsePath is what is known of one server's response path. All its
// fields but id and counter are guarded by unbound.mu.
type responsePath struct {
	id      string
	counter prometheus.Counter
	// unbound counts the listings that never came back; last is when the
	// last of them was issued, and redeemed when a listing of this
	// replica's (or, through this replica, of another's) last came back.
	unbound  uint64
	last     time.Time
	redeemed time.Time
	warned   bool
}

func newUnbound(servers []string, shared store.Redemptions, m *Metrics, delivered bool) *unbound {
	u := &unbound{
		shared: shared, paths: make(map[string]*responsePath, len(servers)),
		wake: make(chan struct{}, 1), watched: map[ticketID]*responsePath{},
	}
	for _, id := range servers {
		p := &responsePath{id: id}
		if m != nil && delivered {
			// Every configured server's series from the start, at 0:
			// increase() in an alert then sees the first listing lost.
			p.counter = m.unbound.WithLabelValues(id)
		}
		u.paths[id] = p
	}
	u.order = slices.Sorted(maps.Keys(u.paths))
	return u
}

// issued watches a ticket the Check of a tools/list on serverID issued at
// now.
func (u *unbound) issued(serverID, ticket string, now time.Time) {
	p := u.paths[serverID]
	id, ok := ticketIDOf(ticket)
	if p == nil || !ok {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.queue) >= maxWatched {
		return
	}
	u.watched[id] = p
	u.queue = append(u.queue, due{id, now})
}

// redeemed notes that a ticket of serverID came back at now, whatever the
// response's answer: an error still came through the response path.
func (u *unbound) redeemed(serverID, ticket string, now time.Time) {
	id, ok := ticketIDOf(ticket)
	if !ok {
		return
	}
	u.mu.Lock()
	_, here := u.watched[id]
	delete(u.watched, id)
	if p := u.paths[serverID]; p != nil {
		p.redeemed = now
	}
	remote := !here && u.shared != nil && len(u.remote) < maxRemote
	if remote {
		u.remote = append(u.remote, string(id[:]))
	}
	u.mu.Unlock()
	if remote {
		// The issuing replica decides at its next sweep: written now, not
		// then.
		select {
		case u.wake <- struct{}{}:
		default:
		}
	}
}

// WatchResponsePath decides the listing tickets that fall due and records
// in the shared store those redeemed here for another replica, until ctx
// ends. It logs, once per server, a server whose listings never came back.
func (s *Server) WatchResponsePath(ctx context.Context, log zerolog.Logger) {
	if !s.delivered {
		return
	}
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.unbound.wake:
			s.unbound.flush(log)
		case <-t.C:
			s.unbound.flush(log)
			s.unbound.sweep(s.now(), log)
		}
	}
}

// flush writes the redemptions of other replicas' tickets to the shared
// store, without holding the lock across the write.
func (u *unbound) flush(log zerolog.Logger) {
	u.mu.Lock()
	ids := u.remote
	u.remote = nil
	u.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	if err := u.shared.Redeem(ids, redemptionKept); err != nil {
		log.Debug().Err(err).Int("tickets", len(ids)).Msg("could not record listing tickets redeemed for another replica")
	}
}

// sweep decides the tickets due at now: each one redeemed neither here nor,
// by the shared store's record, on another replica never came back.
func (u *unbound) sweep(now time.Time, log zerolog.Logger) {
	u.mu.Lock()
	var (
		ids    []ticketID
		issued []time.Time
		paths  []*responsePath
	)
	n := 0
	for ; n < len(u.queue) && now.Sub(u.queue[n].issued) >= unboundAfter; n++ {
		d := u.queue[n]
		if p, ok := u.watched[d.id]; ok {
			delete(u.watched, d.id)
			ids, issued, paths = append(ids, d.id), append(issued, d.issued), append(paths, p)
		}
	}
	u.queue = u.queue[n:]
	if len(u.queue) == 0 {
		u.queue = nil // let the grown array go
	}
	u.mu.Unlock()
	if len(ids) == 0 {
		return
	}

	redeemed := make([]bool, len(ids))
	if u.shared != nil {
		keys := make([]string, len(ids))
		for i, id := range ids {
			keys[i] = string(id[:])
		}
		var err error
		if redeemed, err = u.shared.Redeemed(keys); err == nil && len(redeemed) != len(ids) {
			err = fmt.Errorf("%d answers for %d tickets", len(redeemed), len(ids))
		}
		if err != nil {
			// Not known either way: not counted. A store that cannot answer
			// denies every listing and has its own alert.
			log.Debug().Err(err).Int("tickets", len(ids)).Msg("could not ask the shared store whether listing tickets came back through another replica; not counted")
			return
		}
	}

	var warn []*responsePath
	u.mu.Lock()
	for i, p := range paths {
		if redeemed[i] {
			p.redeemed = now
			continue
		}
		p.unbound++
		if issued[i].After(p.last) {
			p.last = issued[i]
		}
		if p.counter != nil {
			p.counter.Inc()
		}
		if !p.warned {
			p.warned = true
			warn = append(warn, p)
		}
	}
	u.mu.Unlock()
	for _, p := range warn {
		log.Warn().Str("server_id", p.id).Int64("unbound_after_ms", unboundAfter.Milliseconds()).
			Msg("tools/list responses capsnap allowed never came back through the response path: " +
				"the agent gets the server's list unfiltered (or Envoy's error) and every tools/call after it is denied no_snapshot. " +
				"Envoy must run capsnap's ext_proc filter (envoy.filters.http.ext_proc, capsnap.ext_proc in envoy/demo.yaml) after ext_authz " +
				"on this server's route: not missing from the http_filters, not disabled in the route's typed_per_filter_config, " +
				"not skipped by its matcher for a listing, with its grpc_service reaching capsnap and " +
				"metadata_options.forwarding_namespaces.untyped naming envoy.filters.http.ext_authz. " +
				"`capsnap check --config FILE --envoy ENVOY.yaml` checks an Envoy bootstrap. " +
				"Logged once per server; capsnap_delivery_unbound_total counts every such listing")
	}
}

// Unbound describes each server whose listings did not come back through
// the response path in the last unboundReported, for /readyz; none when
// every listing did.
func (s *Server) Unbound() []string {
	now := s.now()
	u := s.unbound
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for _, id := range u.order {
		p := u.paths[id]
		if p.unbound == 0 || now.Sub(p.last) >= unboundReported {
			continue
		}
		since := "none has come back since this replica started"
		if !p.redeemed.IsZero() {
			since = "one last came back at " + p.redeemed.UTC().Format(time.RFC3339)
		}
		out = append(out, fmt.Sprintf("server %s: %d tools/list responses capsnap allowed never came back through the response path, the last issued at %s (%s): "+
			"Envoy's ext_proc filter for capsnap is missing, skipped on this server's route, or cannot reach capsnap; every tools/call after such a listing is denied no_snapshot",
			id, p.unbound, p.last.UTC().Format(time.RFC3339), since))
	}
	return out
}
