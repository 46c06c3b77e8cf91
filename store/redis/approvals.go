package redis

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/store"
)

// The approvals replicas share: approval.Store on the Store's connection,
// failing closed with it. A request granted on one replica is consumed on
// another, once.
//
// Keys: each request under its id, "approval:req:{<id>}"; the live request
// of each binding, "approval:binding:{<binding key>}", whose value names
// its id; and an index of every id, "approval:index". Every change is one
// compare-and-set of one key (casScript), so that no script or
// transaction ever names two keys, and the keys need no shared slot on a
// Redis Cluster; the braces keep each key's slot its id's or binding's,
// whatever prefix the store is given. What the keys alone cannot make
// atomic is settled by the compare-and-set: of two replicas opening a
// request for one binding, the one whose pointer lands wins and the other
// answers its request; of two consuming one approval, one finds it
// approved.
//
// Records carry a MAC under the store's secret, as every record here
// does, so write access to Redis alone cannot approve a call: a request
// or pointer that fails its MAC is audited and read as absent. It can
// still put back a record a request held before (an approval after its
// consumption), which approves nothing that was not approved, until the
// approval's own Expires; its second consumption is in the audit trail.

const (
	kindApproval        = "approval"
	kindApprovalBinding = "approval_binding"
)

// casScript sets KEYS[1] to ARGV[2] for ARGV[3] ms, or deletes it when
// ARGV[2] is empty, if it holds ARGV[1] (empty: if it is absent): 1 if it
// did, 0 if the key held something else.
var casScript = rueidis.NewLuaScript(`
local v = redis.call('GET', KEYS[1])
if (v or '') ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1`)

// attempts bounds the compare-and-set retries of one operation: each
// retry means another replica changed the key in between, which for one
// request or binding happens once or twice, never forever.
const attempts = 4

// Approvals is the approval.Store several replicas share.
type Approvals struct {
	s      *Store
	retain time.Duration
}

var _ approval.Store = (*Approvals)(nil)

// NewApprovals returns the approvals kept in s's Redis, each kept retain
// past its Expires. They share s's connection, secret and health: while s
// is unavailable, so are they.
func NewApprovals(s *Store, retain time.Duration) *Approvals {
	return &Approvals{s: s, retain: retain}
}

// Approvals implements store.Backend: the approval requests in s's Redis,
// kept Options.ApprovalsKept past their expiry.
func (s *Store) Approvals() approval.Store { return s.approvals }

func (a *Approvals) requestKey(id string) string  { return a.s.keys.ApprovalRequest(id) }
func (a *Approvals) bindingKey(key string) string { return a.s.keys.ApprovalBinding(key) }
func (a *Approvals) indexKey() string             { return a.s.keys.ApprovalIndex() }

// keep is how long Redis keeps r's record: until retain past its Expires.
func (a *Approvals) keep(r approval.Request, now time.Time) time.Duration {
	return max(r.Expires.Add(a.retain).Sub(now), time.Millisecond)
}

// record is how a request is written: its arguments as a string, since
// encoding/json would compact a json.RawMessage, and the approver is shown
// the bytes the agent sent.
type record struct {
	approval.Request
	Arguments string `json:"arguments"`
}

// seal is r's record, "<mac>.<json>", the MAC over its id and the JSON.
func (a *Approvals) seal(inc string, r approval.Request) (string, error) {
	body, err := json.Marshal(record{r, string(r.Arguments)})
	if err != nil {
		return "", fmt.Errorf("redis: encode approval %s: %w", r.ID, err)
	}
	return a.s.seal.mac(kindApproval, inc, r.ID, string(body)) + "." + string(body), nil
}

func (a *Approvals) open(inc, id, raw string) (approval.Request, bool) {
	m, body, ok := strings.Cut(raw, ".")
	if !ok || !a.s.seal.verify(m, kindApproval, inc, id, body) {
		a.s.rejected(kindApproval, a.requestKey(id))
		return approval.Request{}, false
	}
	var r record
	if err := json.Unmarshal([]byte(body), &r); err != nil || r.ID != id {
		a.s.rejected(kindApproval, a.requestKey(id))
		return approval.Request{}, false
	}
	// A review of a change has no arguments: none, not empty JSON.
	r.Request.Arguments = nil
	if r.Arguments != "" {
		r.Request.Arguments = []byte(r.Arguments)
	}
	return r.Request, true
}

// pointer is a binding key's value, "<id>.<mac>", the MAC binding the id
// to that key.
func (a *Approvals) pointer(inc, key, id string) string {
	return id + "." + a.s.seal.mac(kindApprovalBinding, inc, key, id)
}

func (a *Approvals) openPointer(inc, key, raw string) (string, bool) {
	id, m, ok := strings.Cut(raw, ".")
	if !ok || !a.s.seal.verify(m, kindApprovalBinding, inc, key, id) {
		a.s.rejected(kindApprovalBinding, key)
		return "", false
	}
	return id, true
}

// conn is the connection and the incarnation records are sealed in.
type conn struct {
	a   *Approvals
	inc string
	c   rueidis.Client
}

func (a *Approvals) conn() (conn, error) {
	v, c, err := a.s.current()
	if err != nil {
		return conn{}, err
	}
	return conn{a, v.incarnation, c}, nil
}

// failed marks the store unavailable after err and returns why.
func (c conn) failed(err error) error {
	c.a.s.fail(kindApproval, err)
	return c.a.s.unavailable()
}

// get is key's value, "" when it has none.
func (c conn) get(key string) (string, error) {
	ctx, cancel := c.a.s.ctx()
	defer cancel()
	v, err := c.c.Do(ctx, c.c.B().Get().Key(key).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", nil
	}
	if err != nil {
		return "", c.failed(err)
	}
	return v, nil
}

// request reads request id: its record and raw value, or ok false.
func (c conn) request(id string) (r approval.Request, raw string, ok bool, err error) {
	if raw, err = c.get(c.a.requestKey(id)); err != nil || raw == "" {
		return approval.Request{}, "", false, err
	}
	r, ok = c.a.open(c.inc, id, raw)
	return r, raw, ok, nil
}

// live reads the request binding key's pointer names: its record and raw
// value, and the pointer's raw value ("" for none).
func (c conn) live(key string) (r approval.Request, raw, ptr string, ok bool, err error) {
	if ptr, err = c.get(c.a.bindingKey(key)); err != nil || ptr == "" {
		return approval.Request{}, "", ptr, false, err
	}
	id, ok := c.a.openPointer(c.inc, c.a.bindingKey(key), ptr)
	if !ok {
		return approval.Request{}, "", ptr, false, nil
	}
	r, raw, ok, err = c.request(id)
	return r, raw, ptr, ok && r.Binding.Key() == key, err
}

// cas sets key from old to val (deletes it for val "") for keep.
func (c conn) cas(key, old, val string, keep time.Duration) (bool, error) {
	ctx, cancel := c.a.s.ctx()
	defer cancel()
	n, err := casScript.Exec(ctx, c.c, []string{key}, []string{old, val, strconv.FormatInt(keep.Milliseconds(), 10)}).AsInt64()
	if err != nil {
		return false, c.failed(err)
	}
	return n == 1, nil
}

// update writes r over raw, its record as read.
func (c conn) update(raw string, r approval.Request, now time.Time) (bool, error) {
	val, err := c.a.seal(c.inc, r)
	if err != nil {
		return false, err
	}
	return c.cas(c.a.requestKey(r.ID), raw, val, c.a.keep(r, now))
}

// contended is an operation that lost every compare-and-set it tried.
func contended(op, what string) error {
	return fmt.Errorf("%w: redis: approval %s %s: changed by others %d times", store.ErrUnavailable, op, what, attempts)
}

// Open implements approval.Store.
func (a *Approvals) Open(req approval.Request, now time.Time) (approval.Request, bool, error) {
	if err := req.Validate(now); err != nil {
		return approval.Request{}, false, err
	}
	c, err := a.conn()
	if err != nil {
		return approval.Request{}, false, err
	}
	key := req.Binding.Key()
	val, err := a.seal(c.inc, req)
	if err != nil {
		return approval.Request{}, false, err
	}
	// The pointer outlives every approval its request can become: one
	// granted at the last moment lives ApprovalTTL past the request's
	// Expires.
	pointerKeep := a.keep(req, now) + req.ApprovalTTL
	for range attempts {
		r, _, ptr, ok, err := c.live(key)
		if err != nil {
			return approval.Request{}, false, err
		}
		if ok && r.Binding == req.Binding && r.Holds(now) {
			return r, false, nil
		}
		ctx, cancel := a.s.ctx()
		err = c.c.Do(ctx, c.c.B().Set().Key(a.requestKey(req.ID)).Value(val).Nx().Px(a.keep(req, now)).Build()).Error()
		cancel()
		if rueidis.IsRedisNil(err) {
			return approval.Request{}, false, fmt.Errorf("redis: approval %s exists already", req.ID)
		}
		if err != nil {
			return approval.Request{}, false, c.failed(err)
		}
		set, err := c.cas(a.bindingKey(key), ptr, a.pointer(c.inc, a.bindingKey(key), req.ID), pointerKeep)
		if err != nil {
			return approval.Request{}, false, err
		}
		if set {
			ctx, cancel := a.s.ctx()
			defer cancel()
			score := float64(req.Created.UnixMilli())
			if err := c.c.Do(ctx, c.c.B().Zadd().Key(a.indexKey()).ScoreMember().ScoreMember(score, req.ID).Build()).Error(); err != nil {
				return approval.Request{}, false, c.failed(err)
			}
			return req, true, nil
		}
		// Another replica opened one for the binding in between: answer
		// with its request.
		if _, err := c.cas(a.requestKey(req.ID), val, "", 0); err != nil {
			return approval.Request{}, false, err
		}
	}
	return approval.Request{}, false, contended("open", key)
}

// Get implements approval.Store.
func (a *Approvals) Get(id string, now time.Time) (approval.Request, error) {
	if !approval.ValidID(id) {
		return approval.Request{}, approval.ErrNotFound
	}
	c, err := a.conn()
	if err != nil {
		return approval.Request{}, err
	}
	r, _, ok, err := c.request(id)
	switch {
	case err != nil:
		return approval.Request{}, err
	case !ok:
		return approval.Request{}, approval.ErrNotFound
	}
	return r.At(now), nil
}

// all reads every request in the index, with its raw record, and drops
// from the index the ids whose records Redis no longer holds.
func (c conn) all() ([]approval.Request, []string, error) {
	ctx, cancel := c.a.s.ctx()
	defer cancel()
	ids, err := c.c.Do(ctx, c.c.B().Zrange().Key(c.a.indexKey()).Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		return nil, nil, c.failed(err)
	}
	if len(ids) == 0 {
		return nil, nil, nil
	}
	cmds := make(rueidis.Commands, len(ids))
	for i, id := range ids {
		cmds[i] = c.c.B().Get().Key(c.a.requestKey(id)).Build()
	}
	var (
		rs    []approval.Request
		raws  []string
		gone  []string
		first error
	)
	for i, res := range c.c.DoMulti(ctx, cmds...) {
		raw, err := res.ToString()
		switch {
		case rueidis.IsRedisNil(err):
			gone = append(gone, ids[i])
		case err != nil:
			first = cmp.Or(first, err)
		default:
			if r, ok := c.a.open(c.inc, ids[i], raw); ok {
				rs, raws = append(rs, r), append(raws, raw)
			}
		}
	}
	if first != nil {
		return nil, nil, c.failed(first)
	}
	if len(gone) > 0 {
		if err := c.c.Do(ctx, c.c.B().Zrem().Key(c.a.indexKey()).Member(gone...).Build()).Error(); err != nil {
			return nil, nil, c.failed(err)
		}
	}
	return rs, raws, nil
}

// List implements approval.Store.
func (a *Approvals) List(f approval.Filter, now time.Time) ([]approval.Request, error) {
	c, err := a.conn()
	if err != nil {
		return nil, err
	}
	rs, _, err := c.all()
	if err != nil {
		return nil, err
	}
	return approval.Filtered(rs, f, now), nil
}

// Decide implements approval.Store.
func (a *Approvals) Decide(id string, by approval.Approver, approve bool, reason string, now time.Time) (approval.Request, error) {
	if !approval.ValidID(id) {
		return approval.Request{}, approval.ErrNotFound
	}
	c, err := a.conn()
	if err != nil {
		return approval.Request{}, err
	}
	for range attempts {
		r, raw, ok, err := c.request(id)
		switch {
		case err != nil:
			return approval.Request{}, err
		case !ok:
			return approval.Request{}, approval.ErrNotFound
		}
		d, err := r.Decide(by, approve, reason, now)
		if err != nil {
			return approval.Request{}, err
		}
		if set, err := c.update(raw, d, now); err != nil || set {
			return d, err
		}
	}
	return approval.Request{}, contended("decide", id)
}

// Consume implements approval.Store.
func (a *Approvals) Consume(b approval.Binding, now time.Time) (approval.Request, bool, error) {
	c, err := a.conn()
	if err != nil {
		return approval.Request{}, false, err
	}
	for range attempts {
		r, raw, _, ok, err := c.live(b.Key())
		if err != nil || !ok {
			return approval.Request{}, false, err
		}
		used, ok := r.Consume(b, now)
		if !ok {
			return approval.Request{}, false, nil
		}
		if set, err := c.update(raw, used, now); err != nil || set {
			return used, set, err
		}
	}
	return approval.Request{}, false, contended("consume", b.Key())
}

// Expire implements approval.Store. A record another replica changed
// since it was read is left to that replica (or to the next sweep).
func (a *Approvals) Expire(now time.Time) ([]approval.Request, error) {
	c, err := a.conn()
	if err != nil {
		return nil, err
	}
	rs, raws, err := c.all()
	if err != nil {
		return nil, err
	}
	var out []approval.Request
	var forgotten []string
	for i, r := range rs {
		e, lapsed := r.Expire(now)
		if now.After(r.Expires.Add(a.retain)) {
			// Redis forgets it on its own by its clock; a sweep ahead of
			// that clock forgets it now.
			set, err := c.cas(a.requestKey(r.ID), raws[i], "", 0)
			if err != nil {
				return nil, err
			}
			if set {
				forgotten = append(forgotten, r.ID)
				if lapsed {
					out = append(out, e)
				}
			}
			continue
		}
		if !lapsed {
			continue
		}
		set, err := c.update(raws[i], e, now)
		if err != nil {
			return nil, err
		}
		if set {
			out = append(out, e)
		}
	}
	if len(forgotten) > 0 {
		ctx, cancel := a.s.ctx()
		defer cancel()
		if err := c.c.Do(ctx, c.c.B().Zrem().Key(a.indexKey()).Member(forgotten...).Build()).Error(); err != nil {
			return nil, c.failed(err)
		}
	}
	approval.Newest(out)
	return out, nil
}
