package redis

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/capsnap/capsnap/store"
)

// kindDefinition seals a tool's definitions record.
const kindDefinition = "definition"

// casKeep sets KEYS[1] to ARGV[2], with no expiry, if it holds ARGV[1]
// (empty: if it is absent): 1 if it did, 0 if the key held something else.
// An approved definition is kept until another replaces it.
var casKeep = rueidis.NewLuaScript(`
local v = redis.call('GET', KEYS[1])
if (v or '') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1`)

// A tool's record is "<mac>.<json>", the MAC over its key and the JSON: a
// record written by anyone without the secret is absent, and audited, so
// write access to Redis alone cannot approve a definition. It is bound to
// the incarnation as every record is: a Redis that came back empty has
// forgotten what was approved, and a tool is then seen for the first time
// (change control's first_sight says what that means).

func (s *Store) definitionRecord(inc, key string, st store.ToolState) (string, error) {
	body, err := json.Marshal(st)
	if err != nil {
		return "", fmt.Errorf("redis: encode definitions: %w", err)
	}
	return s.seal.mac(kindDefinition, inc, key, string(body)) + "." + string(body), nil
}

func (s *Store) openDefinition(inc, key, raw string) (store.ToolState, bool) {
	m, body, ok := strings.Cut(raw, ".")
	var st store.ToolState
	if !ok || !s.seal.verify(m, kindDefinition, inc, key, body) || json.Unmarshal([]byte(body), &st) != nil {
		s.rejected(kindDefinition, key)
		return store.ToolState{}, false
	}
	return st, true
}

// ToolStates implements store.Definitions: a GET each, at once (on a
// cluster the tools lie in many slots).
func (s *Store) ToolStates(server string, tools []string) (map[string]store.ToolState, error) {
	out := map[string]store.ToolState{}
	if len(tools) == 0 {
		return out, nil
	}
	v, c, err := s.current()
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(tools))
	gets := make([]rueidis.Completed, len(tools))
	for i, t := range tools {
		keys[i] = s.keys.Definition(server, t)
		gets[i] = c.B().Get().Key(keys[i]).Build()
	}
	ctx, cancel := s.ctx()
	defer cancel()
	for i, res := range c.DoMulti(ctx, gets...) {
		raw, err := res.ToString()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			s.fail("get", err)
			return nil, s.unavailable()
		}
		if st, ok := s.openDefinition(v.incarnation, keys[i], raw); ok {
			out[tools[i]] = st
		}
	}
	return out, nil
}

// ApproveDefinition implements store.Definitions: read, change and
// compare-and-set the tool's record, again if another replica changed it
// in between.
func (s *Store) ApproveDefinition(server, tool, prev string, d store.Definition) (bool, error) {
	ok := false
	err := s.updateDefinition(server, tool, func(st store.ToolState) (store.ToolState, bool) {
		var next store.ToolState
		next, ok = st.Approve(prev, d)
		return next, ok
	})
	return ok, err
}

// OpenReview implements store.Definitions.
func (s *Store) OpenReview(server, tool, digest string, until, now time.Time) (bool, error) {
	ok := false
	err := s.updateDefinition(server, tool, func(st store.ToolState) (store.ToolState, bool) {
		if st.Reviews(digest, now) {
			ok = true
			return st, false // open already: nothing to write
		}
		var next store.ToolState
		next, ok = st.Open(digest, until, now)
		return next, ok
	})
	return ok, err
}

// RejectDefinition implements store.Definitions.
func (s *Store) RejectDefinition(server, tool string, r store.Rejection) error {
	return s.updateDefinition(server, tool, func(st store.ToolState) (store.ToolState, bool) {
		return st.Reject(r), true
	})
}

// updateDefinition applies change to the tool's record, if change says
// to, by compare-and-set.
func (s *Store) updateDefinition(server, tool string, change func(store.ToolState) (store.ToolState, bool)) error {
	v, c, err := s.current()
	if err != nil {
		return err
	}
	key := s.keys.Definition(server, tool)
	for range attempts {
		ctx, cancel := s.ctx()
		raw, err := c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
		cancel()
		if err != nil && !rueidis.IsRedisNil(err) {
			s.fail("get", err)
			return s.unavailable()
		}
		var st store.ToolState
		if raw != "" {
			// A forged record is read as none, and overwritten.
			st, _ = s.openDefinition(v.incarnation, key, raw)
		}
		next, write := change(st)
		if !write {
			return nil
		}
		val, err := s.definitionRecord(v.incarnation, key, next)
		if err != nil {
			return err
		}
		ctx, cancel = s.ctx()
		n, err := casKeep.Exec(ctx, c, []string{key}, []string{raw, val}).AsInt64()
		cancel()
		if err != nil {
			s.fail("definition", err)
			return s.unavailable()
		}
		if n == 1 {
			return nil
		}
	}
	return fmt.Errorf("%w: the definitions of %s/%s kept changing under this replica", store.ErrUnavailable, server, tool)
}
