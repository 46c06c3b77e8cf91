package redis

import (
	"time"

	"github.com/redis/rueidis"
)

// Redeem implements store.Redemptions: a key per ticket, its value a MAC
// binding it to its key, so that write access to Redis alone cannot make
// a listing that never came back look redeemed. All in one round trip.
func (s *Store) Redeem(tickets []string, keep time.Duration) error {
	if len(tickets) == 0 {
		return nil
	}
	v, c, err := s.current()
	if err != nil {
		return err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	cmds := make([]rueidis.Completed, 0, len(tickets))
	for _, t := range tickets {
		key := s.keys.Redeemed(t)
		cmds = append(cmds, c.B().Set().Key(key).Value(s.seal.mac(kindRedemption, v.incarnation, key)).Px(keep).Build())
	}
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			s.fail("redeem", err)
			return s.unavailable()
		}
	}
	return nil
}

// Redeemed implements store.Redemptions, in one round trip (on a cluster,
// one to each node holding a ticket, at once). A record that
// fails its MAC is audited and read as absent: the listing is then counted
// as one that never came back, which is what a forged record hides.
func (s *Store) Redeemed(tickets []string) ([]bool, error) {
	out := make([]bool, len(tickets))
	if len(tickets) == 0 {
		return out, nil
	}
	v, c, err := s.current()
	if err != nil {
		return nil, err
	}
	// A GET each, not one MGET: on a cluster the tickets lie in many
	// slots, and rueidis sends each node its GETs at once.
	keys := make([]string, len(tickets))
	gets := make([]rueidis.Completed, len(tickets))
	for i, t := range tickets {
		keys[i] = s.keys.Redeemed(t)
		gets[i] = c.B().Get().Key(keys[i]).Build()
	}
	ctx, cancel := s.ctx()
	defer cancel()
	for i, res := range c.DoMulti(ctx, gets...) {
		raw, err := res.ToString()
		if rueidis.IsRedisNil(err) {
			continue // not redeemed
		}
		if err != nil {
			s.fail("get", err)
			return nil, s.unavailable()
		}
		if !s.seal.verify(raw, kindRedemption, v.incarnation, keys[i]) {
			s.rejected(kindRedemption, keys[i])
			continue
		}
		out[i] = true
	}
	return out, nil
}
