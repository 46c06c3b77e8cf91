package redis

import (
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/capsnap/capsnap/store"
)

// The calls a snapshot's sequence rules need, recorded in Redis and
// remembered here once seen.

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

// Follows implements store.CallLog.
func (s *Store) Follows(snap *store.Snapshot, tool string, after []string, record bool) (bool, error) {
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
	ok, err := follows.Exec(ctx, c, []string{s.keys.Calls(snap.Epoch), s.keys.Snapshot(snap.Epoch)}, args).AsInt64()
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
