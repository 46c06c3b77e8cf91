package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/rueidis"
)

// The shared invalidations: each replica's view of them, re-read when the
// tracked sequence moves, and the compare-and-set that writes a change.

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

// current returns the replica's view of the invalidations, re-reading it if
// Redis said it moved.
func (s *Store) current() (*view, rueidis.Client, error) {
	c, err := s.healthyClient()
	if err != nil {
		return nil, nil, err
	}
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
