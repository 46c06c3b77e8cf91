// Package store is capsnap's store of record: the capability snapshots,
// the immutable records minted when a principal discovers a server's tools,
// which its later tool calls are verified against, and all else capsnap
// keeps across requests (Backend). Memory is one replica's; store/redis is
// the one replicas share.
//
// A pin holds only for the full (server_id, tool_id, schema_digest,
// principal, epoch) tuple of the snapshot that pinned it: the store
// indexes snapshots by epoch, each snapshot names its principal and server
// and pins each tool at one digest, and the caller holds a call to all of
// them. A snapshot's pins live and die together: no pin is ever evicted on
// its own, which a later call would misread as drift. Memory is bounded
// (ristretto) and every snapshot expires at its valid_until.
//
// Beside the snapshots, a store keeps the counters of the policy's budgets
// and rate limits (policy.Counters; counters.go), which span snapshots.
package store

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/policy"
)

// Pin is one tool as a snapshot pinned it.
type Pin struct {
	ToolID       string             `json:"tool_id"`
	SchemaDigest string             `json:"schema_digest"`
	Effect       policy.EffectClass `json:"effect_class"`
	PolicyDigest string             `json:"policy_digest"`
	// Seq is the store's invalidation sequence when the pin was
	// confirmed: a tool the store saw change at a later sequence
	// (Snapshots.ChangedAt) changed after the pin, even if it changed back.
	Seq uint64 `json:"seq"`
}

// Snapshot is what one principal was authorized against on one server.
// Everything exported is fixed at minting; only the record of the calls
// allowed under it grows, for the policy's sequence rules.
type Snapshot struct {
	Epoch      string
	Principal  string
	ServerID   string
	Session    string
	ObservedAt time.Time
	ValidUntil time.Time
	// Seq is the store's invalidation sequence when the snapshot was
	// minted; each pin has the one that confirmed it.
	Seq uint64
	// NextCursor is the nextCursor of the tools/list page this snapshot
	// was minted from: the request for the next page continues it.
	NextCursor string
	// Pins are sorted by ToolID when the snapshot is stored. A snapshot pins a handful of tools and a
	// store holds up to millions of snapshots: a sorted slice costs a
	// fraction of a map's memory and is as quick to search at this size.
	Pins []Pin

	calls *calls
	// keeper is the call log of the store that took or read the snapshot.
	keeper CallLog
}

// Keep records that log keeps the calls allowed under s: a store sets it on
// every snapshot it takes or reads, before anyone else sees it.
func (s *Snapshot) Keep(log CallLog) { s.keeper = log }

// Follows is the snapshot as the policy's terms read its calls
// (policy.CallLog): its keeper's record of the calls allowed under it. A
// snapshot no store has taken keeps none, and fails closed.
func (s *Snapshot) Follows(tool string, after []string, record bool) (bool, error) {
	if s.keeper == nil {
		return false, fmt.Errorf("%w: snapshot %s is kept by no store", ErrUnavailable, s.Epoch)
	}
	return s.keeper.Follows(s, tool, after, record)
}

// Pin returns the pin of tool, if the snapshot pins it.
func (s *Snapshot) Pin(tool string) (Pin, bool) {
	i, ok := slices.BinarySearchFunc(s.Pins, tool, func(p Pin, tool string) int { return strings.Compare(p.ToolID, tool) })
	if !ok {
		return Pin{}, false
	}
	return s.Pins[i], true
}

// calls are the tools called under one snapshot. They live in the snapshot
// so that they expire with it, and so that recording one is a map write
// rather than a store write the next call would have to wait for.
type calls struct {
	mu   sync.Mutex
	done map[string]struct{}
}

// encode joins parts unambiguously, after prefix: each is length-prefixed,
// so no choice of names can make two different lists encode alike. The
// key is built in one allocation of its exact size: a Check on the shared
// store makes one.
func encode(prefix string, parts ...string) string {
	var num [20]byte
	n := len(prefix)
	for _, s := range parts {
		n += len(strconv.AppendInt(num[:0], int64(len(s)), 10)) + 1 + len(s)
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(prefix)
	for _, s := range parts {
		b.Write(strconv.AppendInt(num[:0], int64(len(s)), 10))
		b.WriteByte(':')
		b.WriteString(s)
	}
	return b.String()
}

// Snapshots is where snapshots live, and what every replica sharing it must
// agree on: which snapshots exist, which tools changed since a pin, and
// which calls a sequence rule has seen. It is the seam between the
// decision and the memory of one process or a store that several share.
//
// A read that finds nothing returns false and a nil error; an error means
// the store cannot answer now (ErrUnavailable), and the caller must deny.
type Snapshots interface {
	// Put stores a new snapshot; it is findable as soon as Put returns.
	Put(s *Snapshot) error
	// ByEpoch returns the snapshot with that epoch, if it has not expired
	// from the store.
	ByEpoch(epoch string) (*Snapshot, bool, error)
	// Latest returns the newest snapshot for (principal, server, session).
	// A shared store may answer from a replica's copy of the newest
	// pointer, which lags one another replica has just moved by the time
	// the store takes to say so.
	Latest(principal, serverID, session string) (*Snapshot, bool, error)
	// LatestNow is Latest read from the store itself, past any copy: what
	// a decision made on Latest is checked against before it denies.
	LatestNow(principal, serverID, session string) (*Snapshot, bool, error)
	// LatestInAnySession returns the newest snapshot for (principal,
	// server), whatever its session: for a denial that says whether a
	// call's session, or its principal, has none.
	LatestInAnySession(principal, serverID string) (*Snapshot, bool, error)

	// Invalidate records that tools of serverID were added, removed or
	// redefined: every pin of them confirmed before now is void.
	Invalidate(serverID string, tools []string) error
	// Seq is the invalidation sequence now: a pin confirmed now carries
	// it.
	Seq() (uint64, error)
	// ChangedAt is the sequence at which the store last saw tool of
	// serverID change; 0 if never.
	ChangedAt(serverID, tool string) (uint64, error)
}

// CallLog is the calls allowed under each snapshot, kept beside it, for
// the policy's rules that span calls (a sequence rule's after,
// policy.CallLog): a store holds it where it holds the snapshots, so that a
// call allowed on one replica counts on every other.
type CallLog interface {
	// Follows reports whether every tool in after has been called, and
	// allowed, under s. If so and record is set, it notes tool as called
	// under s, for the sequence rules of later calls.
	Follows(s *Snapshot, tool string, after []string, record bool) (bool, error)
}

// Redemptions is what a store keeps besides snapshots: which tools/list
// listing tickets came back through the response path on any replica
// that shares it. Envoy may send a listing's Check to one replica and its
// response to another; the replica that issued the ticket asks here
// before it concludes that the response never came back
// (decide/unbound.go).
type Redemptions interface {
	// Redeem records each ticket (a short id the caller derives from it)
	// as redeemed, for keep.
	Redeem(tickets []string, keep time.Duration) error
	// Redeemed reports, for each ticket in order, whether a replica
	// recorded it redeemed and the record is still kept.
	Redeemed(tickets []string) ([]bool, error)
}

// Backend is the one store port: everything capsnap keeps across
// requests, which a backend implements whole (Memory for one replica,
// store/redis for replicas that share it): snapshots and invalidations
// (Snapshots), the calls allowed under each snapshot (CallLog), the
// budgets' and rate limits' counters (policy.Counters, and Counts for the
// operator), the listing tickets that came back (Redemptions), the
// approved definitions of the tools under change control (Definitions),
// the looser policies people accepted (Loosenings) and the approval
// requests people decide (Approvals). A backend that lacks a part does not
// compile where it is opened, rather than deny every budgeted or held call
// at run time; store/storetest is its contract, one suite of a part each.
type Backend interface {
	Snapshots
	CallLog
	policy.Counters
	Counts
	Redemptions
	Definitions
	Loosenings
	// Approvals are the approval requests, kept where the snapshots are.
	Approvals() approval.Store
}

// DefaultApprovalsKept is how long a decided, consumed or lapsed approval
// request is kept, unless a backend's options say otherwise: readable
// (capsnap approvals list, the page) for a day before the store drops it.
const DefaultApprovalsKept = 24 * time.Hour

// Approvals implements Backend: approval.Memory, in this process.
func (m *Memory) Approvals() approval.Store { return m.approvals }

// ErrUnavailable is wrapped by a store that cannot answer now.
var ErrUnavailable = errors.New("snapshot store unavailable")

var _ Backend = (*Memory)(nil)

// Memory is the in-process store of a single replica: the whole Backend.
type Memory struct {
	approvals *approval.Memory
	defs      definitions
	snapshots *ristretto.Cache[string, *Snapshot]
	// latest maps (principal, server, session) to its newest epoch, and
	// expires with that snapshot.
	latest *ristretto.Cache[string, string]
	retain time.Duration
	// held counts the snapshots in the store, expired ones retained for
	// snapshot_expired included.
	held atomic.Int64
	now  func() time.Time

	mu  sync.RWMutex
	seq uint64
	// changed maps server, then tool, to the sequence it last changed at.
	changed map[string]map[string]uint64

	counters counters
	redeemed redemptions
	// accepted are the acceptances of looser policies, by source.
	accepted map[string]Acceptance
}

// MemoryOptions bound a Memory store.
type MemoryOptions struct {
	// MaxSnapshots bounds how many snapshots are kept; the oldest-used go
	// first when it is reached, and their calls deny with no_snapshot.
	MaxSnapshots int64
	// Retain keeps a snapshot this long past its valid_until, so that a
	// late call is told snapshot_expired rather than no_snapshot. Expiry
	// itself is decided by the caller against ValidUntil, never by
	// whether the store still holds the snapshot.
	Retain time.Duration
	// ApprovalsKept is how long an approval request is kept past its
	// expiry; zero means DefaultApprovalsKept.
	ApprovalsKept time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// NewMemory returns an empty store.
func NewMemory(o MemoryOptions) (*Memory, error) {
	if o.MaxSnapshots <= 0 {
		return nil, errors.New("store: MaxSnapshots must be positive")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ApprovalsKept <= 0 {
		o.ApprovalsKept = DefaultApprovalsKept
	}
	m := &Memory{retain: o.Retain, now: o.Now, changed: map[string]map[string]uint64{}, approvals: approval.NewMemory(o.ApprovalsKept)}
	// Every entry costs 1, so MaxCost counts entries: without
	// IgnoreInternalCost ristretto adds its own per-entry size to each
	// cost, and the store would hold a fiftieth of MaxSnapshots. Ten
	// counters per entry is ristretto's advice for its admission sketch.
	snaps, err := ristretto.NewCache(&ristretto.Config[string, *Snapshot]{
		NumCounters: 10 * o.MaxSnapshots, MaxCost: o.MaxSnapshots, BufferItems: 64, IgnoreInternalCost: true,
		// Expiry and eviction both come through here.
		OnEvict: func(*ristretto.Item[*Snapshot]) { m.held.Add(-1) },
	})
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	// Two keys a snapshot: its session's latest, and the any-session one.
	latest, err := ristretto.NewCache(&ristretto.Config[string, string]{
		NumCounters: 20 * o.MaxSnapshots, MaxCost: 2 * o.MaxSnapshots, BufferItems: 64, IgnoreInternalCost: true,
	})
	if err != nil {
		snaps.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	m.snapshots, m.latest = snaps, latest
	return m, nil
}

// Close releases the store's goroutines.
func (m *Memory) Close() {
	m.snapshots.Close()
	m.latest.Close()
}

// Put implements Snapshots.
func (m *Memory) Put(s *Snapshot) error {
	ttl := s.ValidUntil.Sub(m.now())
	if ttl <= 0 {
		return fmt.Errorf("store: snapshot %s is already expired", s.Epoch)
	}
	ttl += m.retain
	s.calls = &calls{}
	s.Keep(m)
	slices.SortFunc(s.Pins, func(a, b Pin) int { return strings.Compare(a.ToolID, b.ToolID) })
	// ristretto applies sets asynchronously, and drops one its buffer has
	// no room for under contention: a snapshot must be findable by the
	// very next request, so a dropped set is tried again.
	admitted := false
	for range setAttempts {
		if m.snapshots.SetWithTTL(s.Epoch, s, 1, ttl) {
			m.snapshots.Wait()
			if _, admitted = m.snapshots.Get(s.Epoch); admitted {
				break
			}
		}
		m.snapshots.Wait()
	}
	if !admitted {
		return fmt.Errorf("store: snapshot %s was not admitted", s.Epoch)
	}
	m.held.Add(1)
	for _, k := range [...]string{LatestKey("", s.Principal, s.ServerID, s.Session), AnySessionKey(s.Principal, s.ServerID)} {
		// Only a dropped set is tried again: a pointer that reads another
		// epoch after it may have been moved since by a newer listing.
		for i := 0; i < setAttempts && !m.latest.SetWithTTL(k, s.Epoch, 1, ttl); i++ {
			m.latest.Wait()
		}
	}
	m.latest.Wait()
	return nil
}

// setAttempts bounds the tries of a set ristretto drops under contention.
const setAttempts = 4

// ByEpoch implements Snapshots.
func (m *Memory) ByEpoch(epoch string) (*Snapshot, bool, error) {
	s, ok := m.snapshots.Get(epoch)
	return s, ok, nil
}

// Latest implements Snapshots.
func (m *Memory) Latest(principal, serverID, session string) (*Snapshot, bool, error) {
	return m.byKey(LatestKey("", principal, serverID, session))
}

// LatestNow implements Snapshots: the memory store has no copy to lag.
func (m *Memory) LatestNow(principal, serverID, session string) (*Snapshot, bool, error) {
	return m.Latest(principal, serverID, session)
}

// LatestInAnySession implements Snapshots.
func (m *Memory) LatestInAnySession(principal, serverID string) (*Snapshot, bool, error) {
	return m.byKey(AnySessionKey(principal, serverID))
}

func (m *Memory) byKey(k string) (*Snapshot, bool, error) {
	epoch, ok := m.latest.Get(k)
	if !ok {
		return nil, false, nil
	}
	return m.ByEpoch(epoch)
}

// Invalidate implements Snapshots.
func (m *Memory) Invalidate(serverID string, tools []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq++
	byTool := m.changed[serverID]
	if byTool == nil {
		byTool = map[string]uint64{}
		m.changed[serverID] = byTool
	}
	for _, t := range tools {
		byTool[t] = m.seq
	}
	return nil
}

// Seq implements Snapshots.
func (m *Memory) Seq() (uint64, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.seq, nil
}

// ChangedAt implements Snapshots.
func (m *Memory) ChangedAt(serverID, tool string) (uint64, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.changed[serverID][tool], nil
}

// LatestKey names the newest snapshot of (principal, server, session) in a
// store, after prefix (a store's namespace, or none): length-prefixed
// (encode), so no choice of names makes two tuples name one snapshot.
func LatestKey(prefix, principal, serverID, session string) string {
	return encode(prefix, principal, serverID, session)
}

// AnySessionKey names the newest snapshot of (principal, server). It has
// two parts where LatestKey has three, so the two never collide in one
// keyspace.
func AnySessionKey(principal, serverID string) string {
	return encode("", principal, serverID)
}

// Held is how many snapshots the store holds now, for the
// capsnap_snapshots_active gauge.
func (m *Memory) Held() int64 { return m.held.Load() }

// Follows implements CallLog. A snapshot this store never held has seen no
// calls, so a sequence rule over it cannot be satisfied.
func (m *Memory) Follows(s *Snapshot, tool string, after []string, record bool) (bool, error) {
	c := s.calls
	if c == nil {
		return len(after) == 0, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, before := range after {
		if _, ok := c.done[before]; !ok {
			return false, nil
		}
	}
	if record && m.now().Before(s.ValidUntil) {
		if c.done == nil {
			// Most snapshots are listed and never called under.
			c.done = map[string]struct{}{}
		}
		c.done[tool] = struct{}{}
	}
	return true, nil
}

// NewEpoch returns an unguessable opaque epoch: 128 random bits.
func NewEpoch() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return "ep_" + base64.RawURLEncoding.EncodeToString(b[:])
}
