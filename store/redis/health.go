package redis

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/capsnap/capsnap/store"
)

// The connection to Redis and the store's health: probing, failing closed
// on any error or timeout, and coming back once a probe succeeds.

func (s *Store) connect() (rueidis.Client, error) {
	if c := s.client.Load(); c != nil {
		return *c, nil
	}
	o := rueidis.ClientOption{
		Username: s.o.Username, Password: s.o.Password,
		SelectDB: s.o.DB, TLSConfig: s.o.TLS,
		ConnWriteTimeout:  s.o.Timeout,
		Dialer:            net.Dialer{Timeout: s.o.Timeout},
		CacheSizeEachConn: 32 << 20,
		OnInvalidations:   s.invalidated,
	}
	// rueidis tells a cluster from one Redis by asking it; capsnap is told
	// which it is, so that a cluster taken for one Redis (or one Redis for
	// a cluster) is an error, not a surprise.
	switch {
	case s.o.Addr != "":
		o.InitAddress, o.ForceSingleClient = []string{s.o.Addr}, true
	case len(s.o.Cluster) > 0:
		o.InitAddress = s.o.Cluster
	default:
		o.InitAddress = s.o.Sentinel.Addrs
		o.Sentinel = rueidis.SentinelOption{
			MasterSet: s.o.Sentinel.MasterSet, Username: s.o.Sentinel.Username, Password: s.o.Sentinel.Password,
			Dialer: o.Dialer, TLSConfig: s.o.TLS,
			// Besides following +switch-master, ask the sentinels now and
			// then: a missed event would otherwise leave the store on a
			// demoted master, which answers (read-only) and never closes.
			TopologyRefreshInterval: sentinelRefresh,
		}
	}
	c, err := rueidis.NewClient(o)
	if err != nil {
		return nil, err
	}
	if len(s.o.Cluster) > 0 && c.Mode() != rueidis.ClientModeCluster {
		c.Close()
		return nil, fmt.Errorf("%s is not a Redis Cluster (cluster_enabled:0): give one Redis as its address", strings.Join(s.o.Cluster, ","))
	}
	s.client.Store(&c)
	return c, nil
}

// sentinelRefresh is how often the store asks the sentinels where the
// master is, besides hearing them say it moved.
const sentinelRefresh = 5 * time.Second

// invalidated is rueidis's callback for Redis's invalidation pushes: nil
// when a connection, and the cache it tracked, is gone.
func (s *Store) invalidated(msgs []rueidis.RedisMessage) {
	if msgs == nil {
		s.dirty.Add(1)
		return
	}
	for _, m := range msgs {
		if k, err := m.ToString(); err == nil && k == s.keys.Seq() {
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
	s.reported.Store(true)
	if !s.healthy.Swap(true) {
		s.o.Log.Info().Str("addr", s.where).Msg("snapshot store available")
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
	// Said when the store goes, and once if it never came: a replica
	// started while Redis is down must say so, not only fail readiness.
	if s.healthy.Swap(false) || !s.reported.Swap(true) {
		s.o.Log.Error().Err(err).Str("op", op).Str("addr", s.where).Msg("snapshot store unavailable: denying every tools/list and tools/call until it answers")
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
	return fmt.Errorf("%w: redis %s: %v", store.ErrUnavailable, s.where, *s.lastErr.Load())
}

func (s *Store) rejected(kind, key string) {
	s.metrics.rejected.WithLabelValues(kind).Inc()
	s.o.Audit.Warn().Str("event", "store_record_rejected").Str("kind", kind).Str("key", key).
		Msg("a record in the snapshot store fails its MAC; treated as absent (an invalidation: as a change now)")
}

func (s *Store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.o.Timeout)
}
