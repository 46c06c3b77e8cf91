// Package redis is the cache.Store that several capsnap replicas share,
// kept in Redis (or Valkey): a snapshot minted on any replica is verified
// on any other with the same verdict, a list_changed any replica sees voids
// the changed tools' pins on all of them, sequence rules see the calls
// every replica allowed, and budgets and rate limits count them
// (counters.go).
//
// Every record carries a MAC under the secret the replicas share, so write
// access to Redis alone cannot mint a snapshot, record a call or lower the
// invalidation sequence: a snapshot, pointer or call record that fails its
// MAC is treated as absent, an invalidation that fails it as a change now,
// and each is audited.
//
// The hot path stays local. Snapshots are immutable, so a replica keeps the
// ones it has read. What can change is watched through Redis's
// server-assisted client-side caching: the newest-snapshot pointers are
// read through rueidis's cache, and the invalidation sequence is tracked,
// so a replica re-reads the invalidations only when Redis tells it the
// sequence moved. An allowed call whose snapshot a replica holds makes no
// round trip, except that a sequence rule makes exactly one, and so does
// each budget or rate limit.
//
// The store fails closed: when Redis cannot be reached, or answers slower
// than Options.Timeout, every read and write returns cache.ErrUnavailable
// until a probe succeeds again. A Redis that comes back empty has a new
// incarnation, whose records no snapshot of the old one matches.
package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/cache"
	"github.com/capsnap/capsnap/internal/bounded"
)

// Options configure a Store.
type Options struct {
	Addr     string
	Username string
	Password string
	DB       int
	TLS      *tls.Config
	// KeyPrefix starts every key the store writes.
	KeyPrefix string
	// Secret authenticates every record; the replicas sharing a Redis
	// share it. At least 32 bytes.
	Secret []byte
	// Timeout bounds each Redis operation: a Redis slower than this is
	// unavailable.
	Timeout time.Duration
	// ProbeInterval is how often the store checks Redis, and so bounds how
	// long it takes to see Redis gone or back.
	ProbeInterval time.Duration
	// Retain keeps a snapshot this long past its valid_until, so that a
	// late call is told snapshot_expired rather than no_snapshot.
	Retain time.Duration
	// MaxLocal bounds the snapshots a replica keeps in memory.
	MaxLocal int64
	// Log gets the store's health changes; Audit a line for every record
	// that fails its MAC.
	Log   zerolog.Logger
	Audit zerolog.Logger
	// Registerer, if set, gets the store's metrics.
	Registerer prometheus.Registerer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Store is a cache.Store on Redis.
type Store struct {
	o     Options
	seal  *sealer
	keys  keys
	local *ristretto.Cache[string, *cache.Snapshot]
	// known are the calls this replica has seen recorded in Redis, by
	// incarnation, epoch and tool (knownKey). A call's record is never
	// removed while its snapshot lives, so a sequence rule once seen
	// satisfied stays satisfied, and a call once seen recorded needs no
	// second write: the sequence rules of an agent's repeated calls cost
	// Redis one round trip, not one each.
	// Each is held until its record's expiry; bounded like the
	// snapshots kept here.
	known bounded.Map[knownKey, time.Time]
	// pointers are the newest-snapshot pointers whose MAC this replica
	// checked, by key: one read through the client-side cache is the
	// same bytes until the pointer moves, and needs no second check.
	// Bounded like the snapshots kept here, by the keys held (a pointer
	// that moved replaces its key's entry).
	pointers bounded.Map[string, checkedPointer]
	client   atomic.Pointer[rueidis.Client]

	// healthy is false from a failed probe or operation until a probe and
	// a resync succeed.
	healthy atomic.Bool
	// dirty counts the signs that the view may be stale (the sequence key
	// changed, a connection dropped); synced is the count the view was
	// read at. The view is current while they are equal.
	dirty, synced atomic.Uint64
	view          atomic.Pointer[view]
	// mu serialises resyncs and holds the invalidations not yet written.
	mu      sync.Mutex
	pending []pendingInvalidation
	lastErr atomic.Pointer[error]

	// movedKeys are the pointers this replica moved, until when it reads
	// them past its copy.
	movedMu   sync.Mutex
	movedKeys map[string]time.Time

	stop    context.CancelFunc
	done    chan struct{}
	metrics *metrics
}

var (
	_ cache.Store       = (*Store)(nil)
	_ cache.CallLog     = (*Store)(nil)
	_ cache.Redemptions = (*Store)(nil)
)

type keys struct{ seq, inv, snap, latest, any, calls, redeemed, counter string }

// Open returns a Store and starts probing Redis. It returns without
// waiting for Redis: until Redis answers, the store is unavailable.
func Open(o Options) (*Store, error) {
	switch {
	case o.Addr == "":
		return nil, errors.New("redis: an address is required")
	case len(o.Secret) < 32:
		return nil, errors.New("redis: the secret must be at least 32 bytes")
	case o.Timeout <= 0 || o.ProbeInterval <= 0 || o.MaxLocal <= 0:
		return nil, errors.New("redis: Timeout, ProbeInterval and MaxLocal must be positive")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	local, err := ristretto.NewCache(&ristretto.Config[string, *cache.Snapshot]{
		NumCounters: 10 * o.MaxLocal, MaxCost: o.MaxLocal, BufferItems: 64, IgnoreInternalCost: true,
	})
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	p := o.KeyPrefix
	s := &Store{
		o: o, seal: newSealer(o.Secret), local: local, done: make(chan struct{}), movedKeys: map[string]time.Time{},
		keys:    keys{seq: p + "seq", inv: p + "inv", snap: p + "snap:", latest: p + "latest:", any: p + "any:", calls: p + "calls:", redeemed: p + "redeemed:", counter: p + "counter:"},
		metrics: newMetrics(o.Registerer),
	}
	s.dirty.Store(1)
	s.setErr(errors.New("not connected yet"))
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	go s.probe(ctx)
	return s, nil
}

// Close stops the probe and closes the connections.
func (s *Store) Close() {
	s.stop()
	<-s.done
	if c := s.client.Load(); c != nil {
		(*c).Close()
	}
	s.local.Close()
}
