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
	// seqMark is the sequence record the view was read at.
	seqMark
	changed map[string]map[string]uint64
}

// seqMark is a sequence record as read or written.
type seqMark struct {
	raw, incarnation string
	seq              uint64
}

// rewound reports whether the sequence record now in Redis is behind
// one this replica has read (in its view) or written: less, or the same
// number written again. The sequence only ever moves on, and each write
// is unlike any other (its nonce); going back means Redis lost writes it
// had acknowledged, as in a failover to a replica they had not reached,
// or an old record was written back.
func (m seqMark) rewound(now seqMark) bool {
	return m.raw != "" && m.raw != now.raw && m.incarnation == now.incarnation && now.seq <= m.seq
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
	old := s.view.Load()
	now, err := s.readSeq(ctx, c)
	if err != nil {
		return nil, err
	}
	for attempt := 0; (old != nil && old.seqMark.rewound(now)) || s.written.rewound(now); attempt++ {
		// A pin confirmed at a sequence Redis no longer knows could
		// outlive a change given the same number: every snapshot of this
		// incarnation goes, and a new one starts.
		if attempt == 3 {
			return nil, errors.New("the invalidation sequence went back, and a new incarnation could not be started")
		}
		seen := s.written.seq
		if old != nil {
			seen = max(seen, old.seq)
		}
		s.o.Log.Error().Str("addr", s.where).Uint64("seq_seen", seen).Uint64("seq_now", now.seq).
			Msg("snapshot store's invalidation sequence went back: Redis lost acknowledged writes (a failover?) or an old record was written back; starting a new incarnation, agents list again")
		s.o.Audit.Warn().Str("event", "store_sequence_rewound").Str("key", s.keys.Seq()).Uint64("seq_seen", seen).Uint64("seq_now", now.seq).
			Msg("the snapshot store's invalidation sequence went back; every snapshot of its incarnation is void")
		s.metrics.rewound.Inc()
		err := restart.Exec(ctx, c, []string{s.keys.Seq(), s.keys.Invalidations()}, []string{now.raw, s.seal.seqRecord(newIncarnation(), 0)}).Error()
		if err != nil {
			return nil, fmt.Errorf("start a new incarnation: %w", err)
		}
		if now, err = s.readSeq(ctx, c); err != nil {
			return nil, err
		}
	}
	if old != nil && old.raw == now.raw {
		s.synced.Store(mark)
		return old, nil
	}
	inc, n := now.incarnation, now.seq
	fields, err := c.Do(ctx, c.B().Hgetall().Key(s.keys.Invalidations()).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("read the invalidations: %w", err)
	}
	v := &view{seqMark: now, changed: map[string]map[string]uint64{}}
	for f, raw := range fields {
		server, tool, ok := splitInvField(f)
		if !ok {
			continue // no field capsnap writes; it names no tool capsnap checks
		}
		at, ok := s.seal.openInv(inc, f, raw)
		if !ok {
			// Failing closed: a forged or stale-incarnation invalidation
			// counts as a change now, which voids every pin of the tool.
			s.rejected(kindInvalidation, s.keys.Invalidations()+" "+f)
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
		s.o.Log.Warn().Str("addr", s.where).Msg("snapshot store has a new incarnation (Redis came back empty, or lost writes): every snapshot is gone, agents list again")
	}
	s.view.Store(v)
	s.synced.Store(mark)
	s.metrics.resyncs.Inc()
	return v, nil
}

// readSeq reads the sequence record, tracked so that Redis tells this
// replica when it moves, starting one if there is none.
func (s *Store) readSeq(ctx context.Context, c rueidis.Client) (seqMark, error) {
	res := c.DoCache(ctx, c.B().Get().Key(s.keys.Seq()).Cache(), time.Hour)
	raw, err := res.ToString()
	if err == nil && res.IsCacheHit() {
		// A copy kept from before this replica's own write, whose
		// invalidation is still on its way: ask Redis itself.
		raw, err = c.Do(ctx, c.B().Get().Key(s.keys.Seq()).Build()).ToString()
	}
	if rueidis.IsRedisNil(err) {
		// Empty, or new: this incarnation starts at 0. SET NX, so that of
		// several replicas starting one at a time, one incarnation wins.
		err = c.Do(ctx, c.B().Set().Key(s.keys.Seq()).Value(s.seal.seqRecord(newIncarnation(), 0)).Nx().Build()).Error()
		if err != nil && !rueidis.IsRedisNil(err) {
			return seqMark{}, fmt.Errorf("start the sequence: %w", err)
		}
		// From Redis itself: the client-side cache may still hold the nil
		// it read before the write, until Redis's invalidation arrives.
		raw, err = c.Do(ctx, c.B().Get().Key(s.keys.Seq()).Build()).ToString()
	}
	if err != nil {
		return seqMark{}, fmt.Errorf("read the sequence: %w", err)
	}
	m, err := s.seal.openSeq(raw)
	if err != nil {
		s.rejected(kindSeq, s.keys.Seq())
		return seqMark{}, fmt.Errorf("%w: the sequence record %s fails its MAC: another secret, or a forgery (delete the key to start a new incarnation)", err, s.keys.Seq())
	}
	return m, nil
}

// restart starts a new incarnation, if the sequence is still the one read,
// and drops the old one's invalidations, whose MACs name it.
var restart = rueidis.NewLuaScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('DEL', KEYS[2])
return 1`)

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

// Invalidate implements store.Snapshots. An invalidation that cannot be written
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
		raw, err := c.Do(ctx, c.B().Get().Key(s.keys.Seq()).Build()).ToString()
		var cur seqMark
		switch {
		case rueidis.IsRedisNil(err):
			// Redis is empty: no pin of the old incarnation survives to be
			// voided, but the change is recorded for the new one.
			cur.incarnation = newIncarnation()
		case err != nil:
			return fmt.Errorf("read the sequence: %w", err)
		default:
			if cur, err = s.seal.openSeq(raw); err != nil {
				s.rejected(kindSeq, s.keys.Seq())
				return err
			}
		}
		next := seqMark{incarnation: cur.incarnation, seq: cur.seq + 1}
		next.raw = s.seal.seqRecord(next.incarnation, next.seq)
		args := []string{cur.raw, next.raw}
		for _, p := range s.pending {
			for _, t := range p.tools {
				f := invField(p.server, t)
				args = append(args, f, s.seal.invRecord(next.incarnation, f, next.seq))
			}
		}
		ok, err := invalidate.Exec(ctx, c, []string{s.keys.Seq(), s.keys.Invalidations()}, args).AsInt64()
		if err != nil {
			return fmt.Errorf("write the invalidation: %w", err)
		}
		if ok == 1 {
			s.pending = nil
			s.written = next
			s.dirty.Add(1) // this replica reads its own change on its next decision
			return nil
		}
		if attempt == 10 {
			return errors.New("write the invalidation: the sequence kept moving")
		}
	}
}

// Seq implements store.Snapshots.
func (s *Store) Seq() (uint64, error) {
	v, _, err := s.current()
	if err != nil {
		return 0, err
	}
	return v.seq, nil
}

// ChangedAt implements store.Snapshots.
func (s *Store) ChangedAt(serverID, tool string) (uint64, error) {
	v, _, err := s.current()
	if err != nil {
		return 0, err
	}
	return v.changed[serverID][tool], nil
}
