package decide

import (
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// Options configure a Server.
type Options struct {
	Catalog Catalog
	// Servers are the configured server_ids; a route naming any other is
	// a misconfiguration and is denied.
	Servers []string
	// Rules are the policy (and lockfile) in force at start.
	Rules *Rules
	// Denials says how a denial is answered and whether it lists the tools
	// the caller's snapshot lets it call; the zero value answers with
	// config.StatusOK and config.CallFormError.
	Denials config.Denials
	// Snapshots is the store of record: the snapshots minted at
	// tools/list, and all else capsnap keeps across requests.
	Snapshots Store
	// SnapshotTTL is how long a minted snapshot is valid.
	SnapshotTTL time.Duration
	// Bind is config.BindDelivered (a snapshot is minted from the
	// tools/list response, in Deliver) or config.BindCatalog (at the
	// request, from capsnap's own view); empty means BindDelivered.
	Bind string
	// MaxResponseBytes bounds a tools/list response Deliver reads; zero
	// means 1 MiB.
	MaxResponseBytes int
	// ListingKey authenticates the tickets a tools/list's Check hands its
	// response's Deliver; nil means a random key of this process.
	ListingKey []byte
	// Freshness bounds how stale a catalog may be for tools/call.
	Freshness config.Catalog
	Principal config.Principal
	Limits    mcpparse.Limits
	// Envelope, if set, signs the envelope of every allowed tools/call
	// (docs/ENVELOPE.md), valid for EnvelopeTTL (zero means 30s) and never
	// past the snapshot's valid_until.
	Envelope    *envelope.Keys
	EnvelopeTTL time.Duration
	// Grants are the grant keys of the servers that take envelopes under
	// a grant, by server_id: capsnap signs once per snapshot and tool for
	// those, and every other's envelopes whole.
	Grants map[string]*envelope.Recipient
	// Observe are the servers in config.ModeObserve: their decisions are
	// made, audited and counted, and none is enforced.
	Observe []string
	// Approvals, if set, is where the calls the policy holds for a
	// person's approval are asked and their approvals used; without it,
	// such a call fails closed (store_unavailable).
	Approvals *approval.Service
	// ReleaseOnError are the servers whose failed calls (a JSON-RPC error,
	// a tool result with isError) give back what they reserved of their
	// budgets and rate limits, through the response path (Settle).
	ReleaseOnError []string
	// WithoutListing are the servers that take a call from a caller with
	// no snapshot on them, judged on the live, approved definition
	// (unlisted.go).
	WithoutListing []string
	// Audit receives one line per decision.
	Audit   zerolog.Logger
	Metrics *Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// NewEpoch makes snapshot epochs; nil means store.NewEpoch. Tests
	// replace it to get stable golden responses.
	NewEpoch func() string
}

// Server is the decision core: Decide for a request, Deliver for a
// tools/list's own answer, Screen for every other answer.
type Server struct {
	catalog Catalog
	servers map[string]bool
	// observe are the servers in config.ModeObserve.
	observe map[string]bool
	// elicitors are the sessions whose client takes URL elicitations
	// (elicitation.go).
	elicitors elicitors
	// releaseOnError are the servers of Options.ReleaseOnError, and
	// releaseKey seals their release tickets (release.go).
	releaseOnError map[string]bool
	releaseKey     []byte
	// withoutListing are the servers of Options.WithoutListing.
	withoutListing map[string]bool
	rules          atomic.Pointer[Rules]
	denials        config.Denials
	schemas        schemas
	snapshots      Store
	// counters hold the budgets and rate limits: the snapshot store's.
	counters policy.Counters
	// approvals are the approvals people gave (approvals.go), and reviews
	// where changed definitions wait for a person (changes.go), both nil
	// without an approval service.
	approvals Approvals
	reviews   Reviews
	// definitions are the tool definitions seen, by digest, and diffs the
	// changes between them computed (changes.go).
	definitions definitions
	diffs       diffs
	ttl         time.Duration
	// delivered is true with config.BindDelivered.
	delivered   bool
	maxResponse int
	listingKey  []byte
	freshness   config.Catalog
	principal   config.Principal
	limits      mcpparse.Limits
	// signer is nil when envelopes are off.
	signer      Signer
	envelopeTTL time.Duration
	recipients  map[string]*envelope.Recipient
	grants      grants
	auditLog    zerolog.Logger
	metrics     *Metrics
	now         func() time.Time
	newEpoch    func() string
	// unbound watches that the listings allowed come back through the
	// response path (unbound.go).
	unbound *unbound
	// passed are capsnap_deliveries_total{result="screened"} by server
	// label, resolved once: every answer to a decided request counts
	// there (Passed).
	passed map[string]prometheus.Counter
}

// New returns a Server. Rules, Catalog and Snapshots are required: capsnap
// never runs without something to decide against.
func New(o Options) (*Server, error) {
	if o.Catalog == nil || o.Rules == nil || o.Snapshots == nil {
		return nil, errors.New("decide: catalog, rules and snapshot store are required")
	}
	if o.SnapshotTTL <= 0 || o.Freshness.MaxAge <= 0 {
		return nil, errors.New("decide: snapshot TTL and catalog max age must be positive")
	}
	s := &Server{
		catalog:   o.Catalog,
		denials:   o.Denials,
		snapshots: o.Snapshots,
		ttl:       o.SnapshotTTL,
		freshness: o.Freshness,
		servers:   map[string]bool{},
		principal: o.Principal,
		limits:    o.Limits,
		auditLog:  o.Audit,
		metrics:   o.Metrics,
		now:       o.Now,
		newEpoch:  o.NewEpoch,

		envelopeTTL: o.EnvelopeTTL,
		recipients:  o.Grants,
		delivered:   o.Bind != config.BindCatalog,
		maxResponse: o.MaxResponseBytes,
		listingKey:  o.ListingKey,
	}
	if o.Bind != "" && o.Bind != config.BindDelivered && o.Bind != config.BindCatalog {
		return nil, fmt.Errorf("decide: bind %q is not %s or %s", o.Bind, config.BindDelivered, config.BindCatalog)
	}
	if s.maxResponse <= 0 {
		s.maxResponse = 1 << 20
	}
	if s.envelopeTTL <= 0 {
		s.envelopeTTL = 30 * time.Second
	}
	if o.Envelope != nil {
		s.signer = o.Envelope
	}
	if s.listingKey == nil {
		s.listingKey = make([]byte, 32)
		_, _ = rand.Read(s.listingKey) // crypto/rand.Read never fails on supported platforms
	}
	s.releaseKey = releaseKey(s.listingKey)
	for _, id := range o.Servers {
		s.servers[id] = true
	}
	s.observe = map[string]bool{}
	for _, id := range o.Observe {
		if !s.servers[id] {
			return nil, fmt.Errorf("decide: observed server %q is not configured", id)
		}
		s.observe[id] = true
	}
	s.releaseOnError = map[string]bool{}
	for _, id := range o.ReleaseOnError {
		if !s.servers[id] {
			return nil, fmt.Errorf("decide: release_on_error server %q is not configured", id)
		}
		s.releaseOnError[id] = true
	}
	s.withoutListing = map[string]bool{}
	for _, id := range o.WithoutListing {
		if !s.servers[id] {
			return nil, fmt.Errorf("decide: calls_without_listing server %q is not configured", id)
		}
		s.withoutListing[id] = true
	}
	// The store that keeps snapshots keeps the budgets and rate limits
	// too: in this process, or shared by every replica.
	s.counters = o.Snapshots
	if o.Approvals != nil {
		s.approvals, s.reviews = approvals{o.Approvals}, o.Approvals
	}
	s.unbound = newUnbound(o.Servers, o.Snapshots, s.metrics, s.delivered)
	if s.metrics != nil {
		s.passed = map[string]prometheus.Counter{"unknown": s.metrics.deliveries.WithLabelValues("unknown", ResultScreened)}
		for id := range s.servers {
			s.passed[id] = s.metrics.deliveries.WithLabelValues(id, ResultScreened)
		}
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.newEpoch == nil {
		s.newEpoch = store.NewEpoch
	}
	s.SetRules(o.Rules)
	return s, nil
}

// CatalogChanged invalidates the tools a catalog change added, removed or
// redefined in every snapshot of serverID, through the store, so that every
// replica sharing it holds them void: a pin holds only while its tool has
// not changed since it was confirmed (Store.ChangedAt), even if it changed
// back. It is the catalog's OnChange, and never adds a tool to a snapshot:
// snapshots are immutable. A catalog's first list changes nothing anyone
// pinned.
func (s *Server) CatalogChanged(serverID string, prev, next *catalog.List, changed []string) {
	// Both sides of a change, for a drift denial to say what changed.
	s.remember(prev, changed)
	s.remember(next, changed)
	// What change control first sees is what it holds a change to; a
	// tool removed keeps its approved definition, which a tool that comes
	// back is compared with.
	r := s.rules.Load()
	s.removed(r, serverID, prev, next, changed)
	if next.Generation <= 1 {
		s.firstSight(r, serverID, next)
	} else {
		s.firstSight(r, serverID, prev)
	}
	if next.Generation <= 1 {
		return
	}
	s.metrics.invalidated(serverID, len(changed))
	// A store that cannot record it now keeps it, and denies every
	// decision, until it can (store/redis).
	_ = s.snapshots.Invalidate(serverID, changed)
}

// Ready reports whether capsnap can decide calls: rules are in force (they
// always are once New returned) and every server's catalog is live by the
// same test a tools/call is held to.
func (s *Server) Ready() error {
	var ids []string
	for id := range s.servers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if _, fail := s.live(id, s.now()); fail != nil {
			return fail
		}
	}
	if _, err := s.snapshots.Seq(); err != nil {
		return storeFailed(err)
	}
	return nil
}

// Observed lists the servers in config.ModeObserve, sorted.
func (s *Server) Observed() []string {
	ids := slices.Collect(maps.Keys(s.observe))
	slices.Sort(ids)
	return ids
}

// SetRules puts rules in force for every decision that starts after it
// returns. Reload is the checked way to get here.
func (s *Server) SetRules(r *Rules) {
	s.rules.Store(r)
	s.metrics.policyInForce(r.Policy.Digest())
	// Rules that put tools under change control hold their next change
	// to what is live now.
	for id := range s.servers {
		if list, _, err := s.catalog.Lookup(id); err == nil {
			s.firstSight(r, id, list)
		}
	}
}
