package approval

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Store keeps requests where every replica sees them. Each operation is
// atomic: whatever replicas race, a request is decided at most once and an
// approval consumed at most once. The rules of each change are Request's
// (Decide, Consume, Expire); a Store only applies them atomically.
//
// An error other than the package's own (ErrNotFound, ErrExpired,
// ErrDecided, ErrNotApprover, ErrSelfApproval) is the store failing to
// answer; a shared store's wraps store.ErrUnavailable. Every caller then
// denies: a store that cannot answer never lets a call through.
type Store interface {
	// Open returns the live request (pending or approved, unexpired) for
	// req.Binding, or else stores req, which Validate must accept, and
	// returns it with opened true: an agent retrying a call opens one
	// request, not one per retry.
	Open(req Request, now time.Time) (r Request, opened bool, err error)
	// Get returns the request id as it stands at now (Request.At), or
	// ErrNotFound.
	Get(id string, now time.Time) (Request, error)
	// List returns the requests that f selects as they stand at now,
	// newest first.
	List(f Filter, now time.Time) ([]Request, error)
	// Decide applies Request.Decide to request id and returns the decided
	// request, or ErrNotFound or Decide's error.
	Decide(id string, by Approver, approve bool, reason string, now time.Time) (Request, error)
	// Consume marks the approval of exactly b consumed, if there is one
	// and it has not expired, and returns it; ok is false when there is
	// none. Of two Consumes of one approval, one finds it.
	Consume(b Binding, now time.Time) (r Request, ok bool, err error)
	// Expire marks every pending or approved request past its Expires
	// expired and returns those it marked: each once, whichever replica
	// sweeps. It also forgets requests older than the store keeps.
	Expire(now time.Time) ([]Request, error)
}

// Filter selects requests; a zero field selects all.
type Filter struct {
	State     State
	Principal string
}

func (f Filter) match(r Request) bool {
	return (f.State == "" || r.State == f.State) && (f.Principal == "" || r.Binding.Principal == f.Principal)
}

// Newest sorts requests newest first, the order List returns them in.
func Newest(rs []Request) {
	slices.SortStableFunc(rs, func(a, b Request) int {
		return cmp.Or(b.Created.Compare(a.Created), cmp.Compare(a.ID, b.ID))
	})
}

// Filtered is the requests of rs, each as it stands at now, that f
// selects, newest first: List's answer from the requests a store holds.
func Filtered(rs []Request, f Filter, now time.Time) []Request {
	out := make([]Request, 0, len(rs))
	for _, r := range rs {
		if r = r.At(now); f.match(r) {
			out = append(out, r)
		}
	}
	Newest(out)
	return out
}

// Memory is the Store of a single replica.
type Memory struct {
	mu        sync.Mutex
	byID      map[string]Request
	byBinding map[string]string
	retain    time.Duration
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty Memory that keeps each request retain past its
// Expires, for approvers and the CLI to look back on.
func NewMemory(retain time.Duration) *Memory {
	return &Memory{byID: map[string]Request{}, byBinding: map[string]string{}, retain: retain}
}

// Open implements Store.
func (m *Memory) Open(req Request, now time.Time) (Request, bool, error) {
	if err := req.Validate(now); err != nil {
		return Request{}, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	key := req.Binding.Key()
	if r, ok := m.byID[m.byBinding[key]]; ok && r.Holds(now) {
		return r.clone(), false, nil
	}
	req = req.clone()
	m.byID[req.ID] = req
	m.byBinding[key] = req.ID
	return req.clone(), true, nil
}

// Get implements Store.
func (m *Memory) Get(id string, now time.Time) (Request, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.byID[id]
	if !ok {
		return Request{}, ErrNotFound
	}
	return r.clone().At(now), nil
}

// List implements Store.
func (m *Memory) List(f Filter, now time.Time) ([]Request, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	all := make([]Request, 0, len(m.byID))
	for _, r := range m.byID {
		all = append(all, r.clone())
	}
	return Filtered(all, f, now), nil
}

// Decide implements Store.
func (m *Memory) Decide(id string, by Approver, approve bool, reason string, now time.Time) (Request, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.byID[id]
	if !ok {
		return Request{}, ErrNotFound
	}
	d, err := r.Decide(by, approve, reason, now)
	if err != nil {
		return Request{}, err
	}
	m.byID[id] = d
	return d.clone(), nil
}

// Consume implements Store.
func (m *Memory) Consume(b Binding, now time.Time) (Request, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.byID[m.byBinding[b.Key()]]
	if !ok {
		return Request{}, false, nil
	}
	c, ok := r.Consume(b, now)
	if !ok {
		return Request{}, false, nil
	}
	m.byID[c.ID] = c
	return c.clone(), true, nil
}

// Expire implements Store.
func (m *Memory) Expire(now time.Time) ([]Request, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Request
	for id, r := range m.byID {
		if e, ok := r.Expire(now); ok {
			m.byID[id] = e
			out = append(out, e.clone())
		}
		if now.After(r.Expires.Add(m.retain)) {
			delete(m.byID, id)
			if key := r.Binding.Key(); m.byBinding[key] == id {
				delete(m.byBinding, key)
			}
		}
	}
	Newest(out)
	return out, nil
}
