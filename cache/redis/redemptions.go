package redis

import (
	"time"

	"github.com/redis/rueidis"
)

// Redeem implements cache.Redemptions: a key per ticket, its value a MAC
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
		key := s.keys.redeemed + t
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

// Redeemed implements cache.Redemptions, in one round trip. A record that
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
	keys := make([]string, len(tickets))
	for i, t := range tickets {
		keys[i] = s.keys.redeemed + t
	}
	ctx, cancel := s.ctx()
	defer cancel()
	vals, err := c.Do(ctx, c.B().Mget().Key(keys...).Build()).ToArray()
	if err != nil {
		s.fail("get", err)
		return nil, s.unavailable()
	}
	for i, val := range vals {
		raw, err := val.ToString()
		if err != nil {
			continue // nil: not redeemed
		}
		if !s.seal.verify(raw, kindRedemption, v.incarnation, keys[i]) {
			s.rejected(kindRedemption, keys[i])
			continue
		}
		out[i] = true
	}
	return out, nil
}
