package redis

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/redis/rueidis"

	"github.com/capsnap/capsnap/store"
)

// kindLoosening seals an acceptance of a looser policy.
const kindLoosening = "loosening"

// An acceptance is one key per accepted source, "<mac>.<json>", the MAC
// over its key and the JSON, expiring at its until: write access to Redis
// alone cannot accept a looser policy for the replicas, or change who
// accepted one and why. A record that fails its MAC is audited and read
// as absent, so the looser policy stays refused. It is bound to the
// incarnation as every record is: a Redis that came back empty has
// forgotten the acceptance, and a replica that has not yet put the files
// in force needs another.

// AcceptLoosening implements store.Loosenings.
func (s *Store) AcceptLoosening(a store.Acceptance) error {
	now := s.o.Now()
	if err := a.Check(now); err != nil {
		return err
	}
	v, c, err := s.current()
	if err != nil {
		return err
	}
	body, err := json.Marshal(a)
	if err != nil {
		return fmt.Errorf("redis: encode acceptance: %w", err)
	}
	key := s.keys.Loosening(a.Source)
	val := s.seal.mac(kindLoosening, v.incarnation, key, string(body)) + "." + string(body)
	ctx, cancel := s.ctx()
	defer cancel()
	if err := c.Do(ctx, c.B().Set().Key(key).Value(val).Px(a.Until.Sub(now)).Build()).Error(); err != nil {
		s.fail("loosening", err)
		return s.unavailable()
	}
	return nil
}

// AcceptedLoosening implements store.Loosenings.
func (s *Store) AcceptedLoosening(source string) (store.Acceptance, bool, error) {
	v, c, err := s.current()
	if err != nil {
		return store.Acceptance{}, false, err
	}
	key := s.keys.Loosening(source)
	ctx, cancel := s.ctx()
	defer cancel()
	raw, err := c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return store.Acceptance{}, false, nil
	}
	if err != nil {
		s.fail("get", err)
		return store.Acceptance{}, false, s.unavailable()
	}
	m, body, ok := strings.Cut(raw, ".")
	var a store.Acceptance
	if !ok || !s.seal.verify(m, kindLoosening, v.incarnation, key, body) || json.Unmarshal([]byte(body), &a) != nil || a.Source != source {
		s.rejected(kindLoosening, key)
		return store.Acceptance{}, false, nil
	}
	// Redis expires the key by its own clock; the store's decides.
	if !s.o.Now().Before(a.Until) {
		return store.Acceptance{}, false, nil
	}
	return a, true, nil
}
