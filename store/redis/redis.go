// Package redis is the store.Snapshots that several capsnap replicas share,
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
// than Options.Timeout, every read and write returns store.ErrUnavailable
// until a probe succeeds again. A Redis that comes back empty has a new
// incarnation, whose records no snapshot of the old one matches; so has
// one whose invalidation sequence went back (a failover that lost
// acknowledged writes), as seen by any replica that read the later one.
//
// Redis is one server, a Redis Cluster (every key hash-tagged so that
// what one operation touches lies in one slot: Layout), or a master that
// Sentinel fails over to a replica.
package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/internal/bounded"
	"github.com/capsnap/capsnap/store"
)

// Options configure a Store. Exactly one of Addr, Cluster and Sentinel
// says where Redis is.
type Options struct {
	// Addr is one Redis, host:port.
	Addr string
	// Cluster are seed nodes (host:port) of a Redis Cluster: the store
	// learns the rest, and follows slots as they move.
	Cluster []string
	// Sentinel finds the master of a Redis that Sentinel fails over.
	Sentinel Sentinel
	// Username and Password authenticate to Redis itself (every node, or
	// the master and its replicas).
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
	// ApprovalsKept is how long an approval request is kept past its
	// expiry; zero means store.DefaultApprovalsKept.
	ApprovalsKept time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

var _ store.Backend = (*Store)(nil)

// Sentinel is a Redis master set that Sentinel watches and fails over.
type Sentinel struct {
	// MasterSet is the name the sentinels monitor the master under.
	MasterSet string
	// Addrs are sentinels, host:port.
	Addrs []string
	// Username and Password authenticate to the sentinels, if they
	// require it.
	Username, Password string
}

// Store is the store of record on Redis: the whole store.Backend.
type Store struct {
	o Options
	// approvals are the approval requests, in the same Redis.
	approvals *Approvals
	seal      *sealer
	keys      Layout
	// where is Redis, for logs and errors.
	where string
	local *ristretto.Cache[string, *store.Snapshot]
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
	// reported is set once the store's health has been said: available,
	// or unavailable from the start.
	reported atomic.Bool
	// dirty counts the signs that the view may be stale (the sequence key
	// changed, a connection dropped); synced is the count the view was
	// read at. The view is current while they are equal.
	dirty, synced atomic.Uint64
	view          atomic.Pointer[view]
	// mu serialises resyncs and holds the invalidations not yet written.
	mu      sync.Mutex
	pending []pendingInvalidation
	// written is the last sequence record this replica wrote: a Redis
	// that shows it less is one that lost it, even before this replica
	// read it back.
	written seqMark
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
	_ store.Backend = (*Store)(nil)
)

// Open returns a Store and starts probing Redis. It returns without
// waiting for Redis: until Redis answers, the store is unavailable.
func Open(o Options) (*Store, error) {
	where, err := o.where()
	if err != nil {
		return nil, err
	}
	switch {
	case strings.ContainsAny(o.KeyPrefix, "{}"):
		return nil, fmt.Errorf("redis: the key prefix %q holds a brace: it would be every key's Redis Cluster hash tag", o.KeyPrefix)
	case len(o.Secret) < 32:
		return nil, errors.New("redis: the secret must be at least 32 bytes")
	case o.Timeout <= 0 || o.ProbeInterval <= 0 || o.MaxLocal <= 0:
		return nil, errors.New("redis: Timeout, ProbeInterval and MaxLocal must be positive")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ApprovalsKept <= 0 {
		o.ApprovalsKept = store.DefaultApprovalsKept
	}
	local, err := ristretto.NewCache(&ristretto.Config[string, *store.Snapshot]{
		NumCounters: 10 * o.MaxLocal, MaxCost: o.MaxLocal, BufferItems: 64, IgnoreInternalCost: true,
	})
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	s := &Store{
		o: o, seal: newSealer(o.Secret), local: local, done: make(chan struct{}), movedKeys: map[string]time.Time{},
		keys: Layout{o.KeyPrefix}, where: where, metrics: newMetrics(o.Registerer),
	}
	s.approvals = NewApprovals(s, o.ApprovalsKept)
	s.dirty.Store(1)
	s.setErr(errors.New("not connected yet"))
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	go s.probe(ctx)
	return s, nil
}

// where checks that exactly one of Addr, Cluster and Sentinel is given, and
// names it.
func (o Options) where() (string, error) {
	n := 0
	var where string
	if o.Addr != "" {
		n, where = n+1, o.Addr
	}
	if len(o.Cluster) > 0 {
		n, where = n+1, "cluster "+strings.Join(o.Cluster, ",")
	}
	if o.Sentinel.MasterSet != "" || len(o.Sentinel.Addrs) > 0 {
		if o.Sentinel.MasterSet == "" || len(o.Sentinel.Addrs) == 0 {
			return "", errors.New("redis: a sentinel needs a master set and at least one address")
		}
		n, where = n+1, "sentinel "+o.Sentinel.MasterSet+"@"+strings.Join(o.Sentinel.Addrs, ",")
	}
	switch {
	case n != 1:
		return "", errors.New("redis: exactly one of an address, a cluster and a sentinel is required")
	case o.DB != 0 && len(o.Cluster) > 0:
		return "", errors.New("redis: a cluster has database 0 only")
	}
	return where, nil
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
