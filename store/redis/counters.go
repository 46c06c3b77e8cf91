package redis

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// The counters of the policy's budgets and rate limits (policy.Counters,
// and store.Counts for the operator), shared by every replica: a hash per counter, a field per slot (its start
// in Unix milliseconds) holding what was taken in it. Each reservation and
// each release is one script, so one round trip, and atomic: replicas
// reserving on one counter at once are serialised by Redis.
//
// Each counter is one key, its name hash-tagged, so that the store works
// on Redis Cluster. Counters carry no MAC: what a forged one could do,
// deleting a key, a Redis that comes back empty does too, and both give
// the principals back their windows. Run Redis with persistence where
// that matters.

var _ policy.Counters = (*Store)(nil)

// reserve is policy.Counters.Reserve on the hash KEYS[1] at ARGV: now, the
// slot now falls in, the slot width, the window, the amount and the limit
// (milliseconds and counter units). It drops the slots that have stopped
// counting, and answers {allowed, used, retry in ms}. A slot a replica
// whose clock is ahead wrote counts like any other.
var reserve = rueidis.NewLuaScript(`
local now, width, span = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4])
local amount, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
local fields = redis.call('HGETALL', KEYS[1])
local used, live, last = 0, {}, tonumber(ARGV[2])
for i = 1, #fields, 2 do
  local s = tonumber(fields[i])
  if s + width + span <= now then
    redis.call('HDEL', KEYS[1], fields[i])
  else
    local v = tonumber(fields[i + 1])
    used = used + v
    live[#live + 1] = {s, v}
    if s > last then last = s end
  end
end
if used + amount > limit then
  local retry = 0
  if amount <= limit then
    table.sort(live, function(a, b) return a[1] < b[1] end)
    local freed = 0
    for _, e in ipairs(live) do
      freed = freed + e[2]
      if used - freed + amount <= limit then
        retry = e[1] + width + span - now
        break
      end
    end
  end
  return {0, used, retry}
end
if amount > 0 then
  redis.call('HINCRBY', KEYS[1], ARGV[2], amount)
  redis.call('PEXPIRE', KEYS[1], last + width + span - now)
end
return {1, used, 0}`)

// release is policy.Counters.Release on the hash KEYS[1]: the slot ARGV[1]
// gives back ARGV[2] (negative), as far as it still holds it.
var release = rueidis.NewLuaScript(`
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
if redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2]) <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 1`)

var errCharge = errors.New("redis: a charge needs a positive window and slot, and a limit and amount of at least 0")

// Reserve implements policy.Counters.
func (s *Store) Reserve(c policy.Charge) (policy.Usage, error) {
	if c.Window <= 0 || c.Slot <= 0 || c.Amount < 0 || c.Limit < 0 {
		return policy.Usage{}, errCharge
	}
	client, err := s.healthyClient()
	if err != nil {
		return policy.Usage{}, err
	}
	now := s.o.Now().UnixMilli()
	width := c.Slot.Milliseconds()
	start := now - now%width
	ctx, cancel := s.ctx()
	defer cancel()
	out, err := reserve.Exec(ctx, client, []string{s.counterKey(c.Counter)}, []string{
		strconv.FormatInt(now, 10), strconv.FormatInt(start, 10), strconv.FormatInt(width, 10),
		strconv.FormatInt(c.Window.Milliseconds(), 10), strconv.FormatInt(c.Amount, 10), strconv.FormatInt(c.Limit, 10),
	}).AsIntSlice()
	if err == nil && len(out) != 3 {
		err = errors.New("reserve: not 3 integers")
	}
	if err != nil {
		s.fail("reserve", err)
		return policy.Usage{}, s.unavailable()
	}
	u := policy.Usage{Allowed: out[0] == 1, Used: out[1]}
	if u.Allowed {
		u.At = time.UnixMilli(start)
	} else {
		u.RetryAfter = time.Duration(out[2]) * time.Millisecond
	}
	return u, nil
}

// Release implements policy.Counters.
func (s *Store) Release(counter string, at time.Time, amount int64) error {
	client, err := s.healthyClient()
	if err != nil {
		return err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	err = release.Exec(ctx, client, []string{s.counterKey(counter)}, []string{
		strconv.FormatInt(at.UnixMilli(), 10), strconv.FormatInt(-amount, 10),
	}).Error()
	if err != nil {
		s.fail("release", err)
		return s.unavailable()
	}
	return nil
}

// counterKey is the key of a counter: its name hashed (a principal's id is
// the operator's to keep out of Redis's keyspace, and of any length), all
// of it the hash tag.
func (s *Store) counterKey(counter string) string {
	sum := sha256.Sum256([]byte(counter))
	return s.keys.Counter(base64.RawURLEncoding.EncodeToString(sum[:16]))
}

// count is store.Counts on the hash KEYS[1] at ARGV: now, the slot width
// and the window (milliseconds), and "1" to empty it after. It answers
// {used, when the oldest slot that counts stops, when the newest does},
// by the rule reserve counts by; 0s for none.
var count = rueidis.NewLuaScript(`
local now, width, span = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local fields = redis.call('HGETALL', KEYS[1])
local used, first, last = 0, 0, 0
for i = 1, #fields, 2 do
  local stop = tonumber(fields[i]) + width + span
  local v = tonumber(fields[i + 1])
  if stop > now and v > 0 then
    used = used + v
    if first == 0 or stop < first then first = stop end
    if stop > last then last = stop end
  end
end
if ARGV[4] == '1' then redis.call('DEL', KEYS[1]) end
return {used, first, last}`)

// Count implements store.Counts.
func (s *Store) Count(counter string, window, slot time.Duration) (store.Count, error) {
	return s.count(counter, window, slot, false)
}

// ResetCounter implements store.Counts: what it held, read and deleted in
// one script, so that no reservation falls between.
func (s *Store) ResetCounter(counter string, window, slot time.Duration) (store.Count, error) {
	return s.count(counter, window, slot, true)
}

func (s *Store) count(counter string, window, slot time.Duration, reset bool) (store.Count, error) {
	if window <= 0 || slot <= 0 {
		return store.Count{}, errCharge
	}
	client, err := s.healthyClient()
	if err != nil {
		return store.Count{}, err
	}
	op, flag := "count", "0"
	if reset {
		op, flag = "reset", "1"
	}
	ctx, cancel := s.ctx()
	defer cancel()
	out, err := count.Exec(ctx, client, []string{s.counterKey(counter)}, []string{
		strconv.FormatInt(s.o.Now().UnixMilli(), 10), strconv.FormatInt(slot.Milliseconds(), 10),
		strconv.FormatInt(window.Milliseconds(), 10), flag,
	}).AsIntSlice()
	if err == nil && len(out) != 3 {
		err = errors.New(op + ": not 3 integers")
	}
	if err != nil {
		s.fail(op, err)
		return store.Count{}, s.unavailable()
	}
	c := store.Count{Used: out[0]}
	if c.Used > 0 {
		c.FreesAt, c.ResetsAt = time.UnixMilli(out[1]), time.UnixMilli(out[2])
	}
	return c, nil
}
