package redis

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/redis/rueidis"

	"github.com/capsnap/capsnap/cache"
)

// The connection to Redis and the store's health: probing, failing closed
// on any error or timeout, and coming back once a probe succeeds.

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

// healthyClient is the client, while the store is available.
func (s *Store) healthyClient() (rueidis.Client, error) {
	if !s.healthy.Load() {
		return nil, s.unavailable()
	}
	return *s.client.Load(), nil
}

func (s *Store) unavailable() error {
	return fmt.Errorf("%w: redis %s: %v", cache.ErrUnavailable, s.o.Addr, *s.lastErr.Load())
}

func (s *Store) rejected(kind, key string) {
	s.metrics.rejected.WithLabelValues(kind).Inc()
	s.o.Audit.Warn().Str("event", "store_record_rejected").Str("kind", kind).Str("key", key).
		Msg("a record in the snapshot store fails its MAC; treated as absent (an invalidation: as a change now)")
}

func (s *Store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.o.Timeout)
}
