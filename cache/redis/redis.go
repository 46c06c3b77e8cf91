// Package redis is the cache.Store that several capsnap replicas share,
// kept in Redis (or Valkey): a snapshot minted on any replica is verified
// on any other with the same verdict, a list_changed any replica sees voids
// the changed tools' pins on all of them, and sequence rules see the calls
// every replica allowed.
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
// round trip, except that a sequence rule makes exactly one.
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
	"net"
	"slices"
	"strconv"
	"strings"
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

// view is what a replica knows of the shared invalidations.
type view struct {
	incarnation string
	seq         uint64
	changed     map[string]map[string]uint64
}

type pendingInvalidation struct {
	server string
	tools  []string
}

type keys struct{ seq, inv, snap, latest, any, calls, redeemed string }

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
		keys:    keys{seq: p + "seq", inv: p + "inv", snap: p + "snap:", latest: p + "latest:", any: p + "any:", calls: p + "calls:", redeemed: p + "redeemed:"},
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

func (s *Store) connect() (rueidis.Client, error) {
	if c := s.client.Load(); c != nil {
		return *c, nil
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{s.o.Addr}, Username: s.o.Username, Password: s.o.Password,
		SelectDB: s.o.DB, TLSConfig: s.o.TLS, ForceSingleClient: true,
		ConnWriteTimeout:  s.o.Timeout,
		Dialer:            net.Dialer{Timeout: s.o.Timeout},
		CacheSizeEachConn: 32 << 20,
		OnInvalidations:   s.invalidated,
	})
	if err != nil {
		return nil, err
	}
	s.client.Store(&c)
	return c, nil
}

// invalidated is rueidis's callback for Redis's invalidation pushes: nil
// when a connection, and the cache it tracked, is gone.
func (s *Store) invalidated(msgs []rueidis.RedisMessage) {
	if msgs == nil {
		s.dirty.Add(1)
		return
	}
	for _, m := range msgs {
		if k, err := m.ToString(); err == nil && k == s.keys.seq {
			s.dirty.Add(1)
			return
		}
	}
}

// probe checks Redis every ProbeInterval, writes the invalidations that
// could not be written, and brings the store back once Redis answers.
func (s *Store) probe(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.o.ProbeInterval)
	defer t.Stop()
	for {
		s.check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Store) check(ctx context.Context) {
	err := s.ping(ctx)
	if err == nil {
		err = s.flushPending(ctx)
	}
	if err == nil && !s.healthy.Load() {
		_, err = s.resync()
	}
	if err != nil {
		s.fail("probe", err)
		return
	}
	if !s.healthy.Swap(true) {
		s.o.Log.Info().Str("addr", s.o.Addr).Msg("snapshot store available")
	}
	s.metrics.up.Set(1)
}

func (s *Store) ping(ctx context.Context) error {
	c, err := s.connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	defer cancel()
	return c.Do(ctx, c.B().Ping().Build()).Error()
}

// fail marks the store unavailable: every operation fails fast until a
// probe brings it back.
func (s *Store) fail(op string, err error) {
	s.metrics.failures.WithLabelValues(op).Inc()
	s.setErr(fmt.Errorf("%s: %w", op, err))
	s.dirty.Add(1)
	if s.healthy.Swap(false) {
		s.o.Log.Error().Err(err).Str("op", op).Str("addr", s.o.Addr).Msg("snapshot store unavailable: denying every tools/list and tools/call until it answers")
	}
	s.metrics.up.Set(0)
}

func (s *Store) setErr(err error) { s.lastErr.Store(&err) }

func (s *Store) unavailable() error {
	return fmt.Errorf("%w: redis %s: %v", cache.ErrUnavailable, s.o.Addr, *s.lastErr.Load())
}

// current returns the replica's view of the invalidations, re-reading it if
// Redis said it moved.
func (s *Store) current() (*view, rueidis.Client, error) {
	if !s.healthy.Load() {
		return nil, nil, s.unavailable()
	}
	c := *s.client.Load()
	if v := s.view.Load(); v != nil && s.synced.Load() == s.dirty.Load() {
		return v, c, nil
	}
	v, err := s.resync()
	if err != nil {
		s.fail("resync", err)
		return nil, nil, s.unavailable()
	}
	return v, c, nil
}

// resync reads the sequence (tracked, so Redis tells this replica when it
// moves) and, if it moved, every invalidation.
func (s *Store) resync() (*view, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.view.Load(); v != nil && s.synced.Load() == s.dirty.Load() {
		return v, nil
	}
	c, err := s.connect()
	if err != nil {
		return nil, err
	}
	mark := s.dirty.Load()
	ctx, cancel := context.WithTimeout(context.Background(), s.o.Timeout)
	defer cancel()
	res := c.DoCache(ctx, c.B().Get().Key(s.keys.seq).Cache(), time.Hour)
	raw, err := res.ToString()
	if err == nil && res.IsCacheHit() {
		// A copy kept from before this replica's own write, whose
		// invalidation is still on its way: ask Redis itself.
		raw, err = c.Do(ctx, c.B().Get().Key(s.keys.seq).Build()).ToString()
	}
	if rueidis.IsRedisNil(err) {
		// Empty, or new: this incarnation starts at 0. SET NX, so that of
		// several replicas starting one at a time, one incarnation wins.
		err = c.Do(ctx, c.B().Set().Key(s.keys.seq).Value(s.seal.seqRecord(newIncarnation(), 0)).Nx().Build()).Error()
		if err != nil && !rueidis.IsRedisNil(err) {
			return nil, fmt.Errorf("start the sequence: %w", err)
		}
		raw, err = c.DoCache(ctx, c.B().Get().Key(s.keys.seq).Cache(), time.Hour).ToString()
	}
	if err != nil {
		return nil, fmt.Errorf("read the sequence: %w", err)
	}
	inc, n, err := s.seal.openSeq(raw)
	if err != nil {
		s.rejected(kindSeq, s.keys.seq)
		return nil, fmt.Errorf("%w: the sequence record %s fails its MAC: another secret, or a forgery (delete the key to start a new incarnation)", err, s.keys.seq)
	}
	old := s.view.Load()
	if old != nil && old.incarnation == inc && old.seq == n {
		s.synced.Store(mark)
		return old, nil
	}
	fields, err := c.Do(ctx, c.B().Hgetall().Key(s.keys.inv).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("read the invalidations: %w", err)
	}
	v := &view{incarnation: inc, seq: n, changed: map[string]map[string]uint64{}}
	for f, raw := range fields {
		server, tool, ok := splitInvField(f)
		if !ok {
			continue // no field capsnap writes; it names no tool capsnap checks
		}
		at, ok := s.seal.openInv(inc, f, raw)
		if !ok {
			// Failing closed: a forged or stale-incarnation invalidation
			// counts as a change now, which voids every pin of the tool.
			s.rejected(kindInvalidation, s.keys.inv+" "+f)
			at = n
		}
		if v.changed[server] == nil {
			v.changed[server] = map[string]uint64{}
		}
		v.changed[server][tool] = max(v.changed[server][tool], at)
	}
	if old != nil && old.incarnation != inc {
		// Redis lost what it held: the snapshots kept here went with it,
		// and the calls seen recorded (knownKey names the incarnation too).
		s.local.Clear()
		s.known.Clear()
		s.o.Log.Warn().Str("addr", s.o.Addr).Msg("snapshot store has a new incarnation (Redis came back empty): every snapshot is gone, agents list again")
	}
	s.view.Store(v)
	s.synced.Store(mark)
	s.metrics.resyncs.Inc()
	return v, nil
}

func (s *Store) rejected(kind, key string) {
	s.metrics.rejected.WithLabelValues(kind).Inc()
	s.o.Audit.Warn().Str("event", "store_record_rejected").Str("kind", kind).Str("key", key).
		Msg("a record in the snapshot store fails its MAC; treated as absent (an invalidation: as a change now)")
}

func (s *Store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.o.Timeout)
}

// Put implements cache.Store.
func (s *Store) Put(snap *cache.Snapshot) error {
	ttl := snap.ValidUntil.Sub(s.o.Now())
	if ttl <= 0 {
		return fmt.Errorf("redis: snapshot %s is already expired", snap.Epoch)
	}
	v, c, err := s.current()
	if err != nil {
		return err
	}
	slices.SortFunc(snap.Pins, func(a, b cache.Pin) int { return strings.Compare(a.ToolID, b.ToolID) })
	rec, err := s.seal.sealSnapshot(v.incarnation, snap)
	if err != nil {
		return err
	}
	keep := ttl + s.o.Retain
	latest := cache.LatestKey(s.keys.latest, snap.Principal, snap.ServerID, snap.Session)
	any := s.keys.any + cache.AnySessionKey(snap.Principal, snap.ServerID)
	ctx, cancel := s.ctx()
	defer cancel()
	for _, r := range c.DoMulti(ctx,
		c.B().Set().Key(s.keys.snap+snap.Epoch).Value(rec).Px(keep).Build(),
		c.B().Set().Key(latest).Value(s.seal.pointer(v.incarnation, latest, snap.Epoch)).Px(keep).Build(),
		c.B().Set().Key(any).Value(s.seal.pointer(v.incarnation, any, snap.Epoch)).Px(keep).Build(),
	) {
		if err := r.Error(); err != nil {
			s.fail("put", err)
			return s.unavailable()
		}
	}
	// A Redis that restarted empty under the write holds the snapshot
	// under the old incarnation, where no replica can read it: this one
	// must not keep it either.
	if now, _, err := s.current(); err != nil || now.incarnation != v.incarnation {
		return fmt.Errorf("%w: redis %s restarted while the snapshot was written", cache.ErrUnavailable, s.o.Addr)
	}
	snap.Keep(s)
	s.local.SetWithTTL(snap.Epoch, snap, 1, keep)
	s.moved(latest, any)
	return nil
}

// movedWindow is how long after moving a pointer this replica reads it
// from Redis rather than from its copy.
const movedWindow = time.Second

// moved notes the pointers this replica just moved.
func (s *Store) moved(keys ...string) {
	until := s.o.Now().Add(movedWindow)
	s.movedMu.Lock()
	defer s.movedMu.Unlock()
	for _, k := range keys {
		s.movedKeys[k] = until
	}
	// Bounded by the snapshots minted in one window.
	for k, t := range s.movedKeys {
		if t.Before(s.o.Now()) {
			delete(s.movedKeys, k)
		}
	}
}

func (s *Store) movedHere(key string) bool {
	s.movedMu.Lock()
	defer s.movedMu.Unlock()
	until, ok := s.movedKeys[key]
	return ok && s.o.Now().Before(until)
}

// ByEpoch implements cache.Store.
func (s *Store) ByEpoch(epoch string) (*cache.Snapshot, bool, error) {
	v, c, err := s.current()
	if err != nil {
		return nil, false, err
	}
	return s.byEpoch(v, c, epoch)
}

func (s *Store) byEpoch(v *view, c rueidis.Client, epoch string) (*cache.Snapshot, bool, error) {
	if snap, ok := s.local.Get(epoch); ok {
		return snap, true, nil
	}
	ctx, cancel := s.ctx()
	defer cancel()
	key := s.keys.snap + epoch
	res := c.Do(ctx, c.B().Get().Key(key).Build())
	raw, err := res.ToString()
	if rueidis.IsRedisNil(err) {
		return nil, false, nil
	}
	if err != nil {
		s.fail("get", err)
		return nil, false, s.unavailable()
	}
	snap, ok := s.seal.openSnapshot(v.incarnation, epoch, raw)
	if !ok {
		s.rejected(kindSnapshot, key)
		return nil, false, nil
	}
	snap.Keep(s)
	if keep := snap.ValidUntil.Sub(s.o.Now()) + s.o.Retain; keep > 0 {
		s.local.SetWithTTL(epoch, snap, 1, keep)
	}
	return snap, true, nil
}

// Latest implements cache.Store.
func (s *Store) Latest(principal, serverID, session string) (*cache.Snapshot, bool, error) {
	return s.byPointer(cache.LatestKey(s.keys.latest, principal, serverID, session), false)
}

// LatestNow implements cache.Store.
func (s *Store) LatestNow(principal, serverID, session string) (*cache.Snapshot, bool, error) {
	return s.byPointer(cache.LatestKey(s.keys.latest, principal, serverID, session), true)
}

// LatestInAnySession implements cache.Store.
func (s *Store) LatestInAnySession(principal, serverID string) (*cache.Snapshot, bool, error) {
	return s.byPointer(s.keys.any+cache.AnySessionKey(principal, serverID), false)
}

// byPointer follows a newest-snapshot pointer. The pointer is read through
// the client-side cache: another replica's newer snapshot moves it, and
// Redis tells every replica that read it, within a millisecond or so. A
// pointer this replica moved itself in the last second, or a read that
// must be current (now), skips the cache: the invalidation of a copy may
// come after this replica's own write has returned (it tracks on one
// connection and writes on another).
func (s *Store) byPointer(key string, now bool) (*cache.Snapshot, bool, error) {
	v, c, err := s.current()
	if err != nil {
		return nil, false, err
	}
	var raw string
	if now || s.movedHere(key) {
		ctx, cancel := s.ctx()
		raw, err = c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
		cancel()
	} else {
		// ConnWriteTimeout bounds a miss; a hit needs no deadline.
		raw, err = c.DoCache(context.Background(), c.B().Get().Key(key).Cache(), s.o.Retain+time.Hour).ToString()
	}
	if rueidis.IsRedisNil(err) {
		return nil, false, nil
	}
	if err != nil {
		s.fail("get", err)
		return nil, false, s.unavailable()
	}
	if p, ok := s.pointers.Load(key); ok && p.incarnation == v.incarnation && p.raw == raw {
		return s.byEpoch(v, c, p.epoch)
	}
	epoch, ok := s.seal.openPointer(v.incarnation, key, raw)
	if !ok {
		s.rejected(kindLatest, key)
		return nil, false, nil
	}
	s.pointers.Store(key, checkedPointer{v.incarnation, raw, epoch}, s.o.MaxLocal)
	return s.byEpoch(v, c, epoch)
}

// checkedPointer is a pointer record whose MAC verified, and the epoch it
// names.
type checkedPointer struct{ incarnation, raw, epoch string }

// invalidate writes the sequence and the changed tools' records at once,
// if the sequence is still the one read: a compare-and-set, because the
// MACs are made here, not in Redis.
var invalidate = rueidis.NewLuaScript(`
local cur = redis.call('GET', KEYS[1])
if cur == false then cur = '' end
if cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i+1]) end
return 1`)

// Invalidate implements cache.Store. An invalidation that cannot be written
// now is kept, and the store stays unavailable until it is written.
func (s *Store) Invalidate(serverID string, tools []string) error {
	s.mu.Lock()
	s.pending = append(s.pending, pendingInvalidation{serverID, slices.Clone(tools)})
	s.mu.Unlock()
	ctx, cancel := s.ctx()
	defer cancel()
	if err := s.flushPending(ctx); err != nil {
		s.fail("invalidate", err)
		return s.unavailable()
	}
	return nil
}

func (s *Store) flushPending(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 {
		return nil
	}
	c, err := s.connect()
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		raw, err := c.Do(ctx, c.B().Get().Key(s.keys.seq).Build()).ToString()
		var inc string
		var n uint64
		switch {
		case rueidis.IsRedisNil(err):
			// Redis is empty: no pin of the old incarnation survives to be
			// voided, but the change is recorded for the new one.
			raw, inc = "", newIncarnation()
		case err != nil:
			return fmt.Errorf("read the sequence: %w", err)
		default:
			if inc, n, err = s.seal.openSeq(raw); err != nil {
				s.rejected(kindSeq, s.keys.seq)
				return err
			}
		}
		next := n + 1
		args := []string{raw, s.seal.seqRecord(inc, next)}
		for _, p := range s.pending {
			for _, t := range p.tools {
				f := invField(p.server, t)
				args = append(args, f, s.seal.invRecord(inc, f, next))
			}
		}
		ok, err := invalidate.Exec(ctx, c, []string{s.keys.seq, s.keys.inv}, args).AsInt64()
		if err != nil {
			return fmt.Errorf("write the invalidation: %w", err)
		}
		if ok == 1 {
			s.pending = nil
			s.dirty.Add(1) // this replica reads its own change on its next decision
			return nil
		}
		if attempt == 10 {
			return errors.New("write the invalidation: the sequence kept moving")
		}
	}
}

// Seq implements cache.Store.
func (s *Store) Seq() (uint64, error) {
	v, _, err := s.current()
	if err != nil {
		return 0, err
	}
	return v.seq, nil
}

// ChangedAt implements cache.Store.
func (s *Store) ChangedAt(serverID, tool string) (uint64, error) {
	v, _, err := s.current()
	if err != nil {
		return 0, err
	}
	return v.changed[serverID][tool], nil
}

// follows checks the calls a sequence rule needs, and records this one if
// it follows and its snapshot is stored, in one round trip: 0 if it does
// not follow, 1 if it does, 2 if it does and was recorded.
var follows = rueidis.NewLuaScript(`
for i = 3, #ARGV do
  if redis.call('SISMEMBER', KEYS[1], ARGV[i]) == 0 then return 0 end
end
if ARGV[1] ~= '' and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('SADD', KEYS[1], ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 2
end
return 1`)

// Follows implements cache.CallLog.
func (s *Store) Follows(snap *cache.Snapshot, tool string, after []string, record bool) (bool, error) {
	now := s.o.Now()
	record = record && now.Before(snap.ValidUntil)
	if len(after) == 0 && !record {
		return true, nil
	}
	v, c, err := s.current()
	if err != nil {
		return false, err
	}
	if s.seen(now, v.incarnation, snap.Epoch, after...) && (!record || s.seen(now, v.incarnation, snap.Epoch, tool)) {
		return true, nil
	}
	member := ""
	if record {
		member = s.seal.callMember(v.incarnation, snap.Epoch, tool)
	}
	keep := snap.ValidUntil.Sub(now) + s.o.Retain
	args := []string{member, strconv.FormatInt(keep.Milliseconds(), 10)}
	for _, a := range after {
		args = append(args, s.seal.callMember(v.incarnation, snap.Epoch, a))
	}
	ctx, cancel := s.ctx()
	defer cancel()
	ok, err := follows.Exec(ctx, c, []string{s.keys.calls + snap.Epoch, s.keys.snap + snap.Epoch}, args).AsInt64()
	if err != nil {
		s.fail("follows", err)
		return false, s.unavailable()
	}
	if ok == 0 {
		return false, nil
	}
	until := now.Add(keep)
	for _, a := range after {
		s.known.Store(knownKey{v.incarnation, strings.Clone(snap.Epoch), strings.Clone(a)}, until, s.o.MaxLocal)
	}
	if ok == 2 {
		s.known.Store(knownKey{v.incarnation, strings.Clone(snap.Epoch), strings.Clone(tool)}, until, s.o.MaxLocal)
	}
	return true, nil
}

// seen reports whether every one of tools was seen recorded under epoch,
// and its record is still kept at now.
func (s *Store) seen(now time.Time, incarnation, epoch string, tools ...string) bool {
	for _, t := range tools {
		if until, ok := s.known.Load(knownKey{incarnation, epoch, t}); !ok || !now.Before(until) {
			return false
		}
	}
	return true
}

// knownKey names a call seen recorded: Redis's incarnation, the snapshot's
// epoch and the tool.
type knownKey struct{ incarnation, epoch, tool string }
