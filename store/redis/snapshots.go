package redis

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/capsnap/capsnap/store"
)

// Snapshots and the newest-snapshot pointers: written to Redis, read
// through this replica's copies.

// Put implements store.Snapshots.
func (s *Store) Put(snap *store.Snapshot) error {
	ttl := snap.ValidUntil.Sub(s.o.Now())
	if ttl <= 0 {
		return fmt.Errorf("redis: snapshot %s is already expired", snap.Epoch)
	}
	v, c, err := s.current()
	if err != nil {
		return err
	}
	slices.SortFunc(snap.Pins, func(a, b store.Pin) int { return strings.Compare(a.ToolID, b.ToolID) })
	rec, err := s.seal.sealSnapshot(v.incarnation, snap)
	if err != nil {
		return err
	}
	keep := ttl + s.o.Retain
	latest := s.keys.Latest(snap.Principal, snap.ServerID, snap.Session)
	any := s.keys.AnySession(snap.Principal, snap.ServerID)
	ctx, cancel := s.ctx()
	defer cancel()
	writes := []rueidis.Completed{
		c.B().Set().Key(s.keys.Snapshot(snap.Epoch)).Value(rec).Px(keep).Build(),
		c.B().Set().Key(latest).Value(s.seal.pointer(v.incarnation, latest, snap.Epoch)).Px(keep).Build(),
		c.B().Set().Key(any).Value(s.seal.pointer(v.incarnation, any, snap.Epoch)).Px(keep).Build(),
	}
	// No pointer may name a snapshot not yet written: a call following it
	// would be denied no_snapshot. One Redis runs a pipeline in order; a
	// cluster runs each node's part at once, and the snapshot's slot is
	// not its pointers', so there it goes first, in a round trip of its
	// own.
	batches := [][]rueidis.Completed{writes}
	if c.Mode() == rueidis.ClientModeCluster {
		batches = [][]rueidis.Completed{writes[:1], writes[1:]}
	}
	for _, batch := range batches {
		for _, r := range c.DoMulti(ctx, batch...) {
			if err := r.Error(); err != nil {
				s.fail("put", err)
				return s.unavailable()
			}
		}
	}
	// A Redis that restarted empty under the write holds the snapshot
	// under the old incarnation, where no replica can read it: this one
	// must not keep it either.
	if now, _, err := s.current(); err != nil || now.incarnation != v.incarnation {
		return fmt.Errorf("%w: redis %s restarted while the snapshot was written", store.ErrUnavailable, s.where)
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

// ByEpoch implements store.Snapshots.
func (s *Store) ByEpoch(epoch string) (*store.Snapshot, bool, error) {
	v, c, err := s.current()
	if err != nil {
		return nil, false, err
	}
	return s.byEpoch(v, c, epoch)
}

func (s *Store) byEpoch(v *view, c rueidis.Client, epoch string) (*store.Snapshot, bool, error) {
	if snap, ok := s.local.Get(epoch); ok {
		return snap, true, nil
	}
	ctx, cancel := s.ctx()
	defer cancel()
	key := s.keys.Snapshot(epoch)
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

// Latest implements store.Snapshots.
func (s *Store) Latest(principal, serverID, session string) (*store.Snapshot, bool, error) {
	return s.byPointer(s.keys.Latest(principal, serverID, session), false)
}

// LatestNow implements store.Snapshots.
func (s *Store) LatestNow(principal, serverID, session string) (*store.Snapshot, bool, error) {
	return s.byPointer(s.keys.Latest(principal, serverID, session), true)
}

// LatestInAnySession implements store.Snapshots.
func (s *Store) LatestInAnySession(principal, serverID string) (*store.Snapshot, bool, error) {
	return s.byPointer(s.keys.AnySession(principal, serverID), false)
}

// byPointer follows a newest-snapshot pointer. The pointer is read through
// the client-side cache: another replica's newer snapshot moves it, and
// Redis tells every replica that read it, within a millisecond or so. A
// pointer this replica moved itself in the last second, or a read that
// must be current (now), skips the cache: the invalidation of a copy may
// come after this replica's own write has returned (it tracks on one
// connection and writes on another).
func (s *Store) byPointer(key string, now bool) (*store.Snapshot, bool, error) {
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
