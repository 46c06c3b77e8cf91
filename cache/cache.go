// Package cache holds capability snapshots: the immutable records minted
// when a principal discovers a server's tools, which its later tool calls
// are verified against.
//
// A pin holds only for the full (server_id, tool_id, schema_digest,
// principal, epoch) tuple of the snapshot that pinned it: the store
// indexes snapshots by epoch, each snapshot names its principal and server
// and pins each tool at one digest, and the caller holds a call to all of
// them. A snapshot's pins live and die together: no pin is ever evicted on
// its own, which a later call would misread as drift. Memory is bounded (ristretto) and every snapshot expires at its
// valid_until.
package cache

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

	"github.com/capsnap/capsnap/policy"
)

// Pin is one tool as a snapshot pinned it.
type Pin struct {
	ToolID       string             `json:"tool_id"`
	SchemaDigest string             `json:"schema_digest"`
	Effect       policy.EffectClass `json:"effect_class"`
	PolicyDigest string             `json:"policy_digest"`
	// Generation is the generation of the live catalog that confirmed the
	// pinned definition: a definition listed since a later generation
	// (catalog.Tool.Since) changed after the pin, even if it changed back.
	Generation uint64 `json:"generation"`
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
	// CatalogGeneration is the generation of the live catalog when the
	// snapshot was minted; each pin has the one that confirmed it.
	CatalogGeneration uint64
	// NextCursor is the nextCursor of the tools/list page this snapshot
	// was minted from: the request for the next page continues it.
	NextCursor string
	// Pins are sorted by ToolID when the snapshot is stored. A snapshot pins a handful of tools and a
	// store holds up to millions of snapshots: a sorted slice costs a
	// fraction of a map's memory and is as quick to search at this size.
	Pins []Pin

	calls *calls
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

// encode joins parts unambiguously: each is length-prefixed, so no choice
// of names can make two different lists encode alike.
func encode(parts ...string) string {
	n := 0
	for _, s := range parts {
		n += len(s) + 21 // a length, its colon
	}
	var b strings.Builder
	b.Grow(n)
	var num [20]byte
	for _, s := range parts {
		b.Write(strconv.AppendInt(num[:0], int64(len(s)), 10))
		b.WriteByte(':')
		b.WriteString(s)
	}
	return b.String()
}

// Store is where snapshots live: the seam for a shared store when several
// replicas must agree.
type Store interface {
	// Put stores a new snapshot; it is findable as soon as Put returns.
	Put(s *Snapshot) error
	// ByEpoch returns the snapshot with that epoch, if it has not expired
	// from the store.
	ByEpoch(epoch string) (*Snapshot, bool)
	// Latest returns the newest snapshot for (principal, server, session).
	Latest(principal, serverID, session string) (*Snapshot, bool)
	// LatestInAnySession returns the newest snapshot for (principal,
	// server), whatever its session: for a denial that says whether a
	// call's session, or its principal, has none.
	LatestInAnySession(principal, serverID string) (*Snapshot, bool)
	// RecordCall notes that a call to tool was allowed under snapshot s,
	// for the policy's sequence rules; Called asks.
	RecordCall(s *Snapshot, tool string)
	Called(s *Snapshot, tool string) bool
}

var _ Store = (*Memory)(nil)

// Memory is the in-process Store of a single replica.
type Memory struct {
	snapshots *ristretto.Cache[string, *Snapshot]
	// latest maps (principal, server, session) to its newest epoch, and
	// expires with that snapshot.
	latest *ristretto.Cache[string, string]
	retain time.Duration
	// held counts the snapshots in the store, expired ones retained for
	// snapshot_expired included.
	held atomic.Int64
	now  func() time.Time
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
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// NewMemory returns an empty store.
func NewMemory(o MemoryOptions) (*Memory, error) {
	if o.MaxSnapshots <= 0 {
		return nil, errors.New("cache: MaxSnapshots must be positive")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	m := &Memory{retain: o.Retain, now: o.Now}
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
		return nil, fmt.Errorf("cache: %w", err)
	}
	// Two keys a snapshot: its session's latest, and the any-session one.
	latest, err := ristretto.NewCache(&ristretto.Config[string, string]{
		NumCounters: 20 * o.MaxSnapshots, MaxCost: 2 * o.MaxSnapshots, BufferItems: 64, IgnoreInternalCost: true,
	})
	if err != nil {
		snaps.Close()
		return nil, fmt.Errorf("cache: %w", err)
	}
	m.snapshots, m.latest = snaps, latest
	return m, nil
}

// Close releases the store's goroutines.
func (m *Memory) Close() {
	m.snapshots.Close()
	m.latest.Close()
}

// Put implements Store.
func (m *Memory) Put(s *Snapshot) error {
	ttl := s.ValidUntil.Sub(m.now())
	if ttl <= 0 {
		return fmt.Errorf("cache: snapshot %s is already expired", s.Epoch)
	}
	ttl += m.retain
	s.calls = &calls{}
	slices.SortFunc(s.Pins, func(a, b Pin) int { return strings.Compare(a.ToolID, b.ToolID) })
	if !m.snapshots.SetWithTTL(s.Epoch, s, 1, ttl) {
		return fmt.Errorf("cache: snapshot %s was not admitted", s.Epoch)
	}
	// ristretto applies sets asynchronously; a snapshot must be findable
	// by the very next request.
	m.snapshots.Wait()
	if _, ok := m.snapshots.Get(s.Epoch); !ok {
		return fmt.Errorf("cache: snapshot %s was not admitted", s.Epoch)
	}
	m.held.Add(1)
	m.latest.SetWithTTL(latestKey(s.Principal, s.ServerID, s.Session), s.Epoch, 1, ttl)
	m.latest.SetWithTTL(anySessionKey(s.Principal, s.ServerID), s.Epoch, 1, ttl)
	m.latest.Wait()
	return nil
}

// ByEpoch implements Store.
func (m *Memory) ByEpoch(epoch string) (*Snapshot, bool) {
	return m.snapshots.Get(epoch)
}

// Latest implements Store.
func (m *Memory) Latest(principal, serverID, session string) (*Snapshot, bool) {
	epoch, ok := m.latest.Get(latestKey(principal, serverID, session))
	if !ok {
		return nil, false
	}
	return m.snapshots.Get(epoch)
}

// LatestInAnySession implements Store.
func (m *Memory) LatestInAnySession(principal, serverID string) (*Snapshot, bool) {
	epoch, ok := m.latest.Get(anySessionKey(principal, serverID))
	if !ok {
		return nil, false
	}
	return m.snapshots.Get(epoch)
}

func latestKey(principal, serverID, session string) string {
	return encode(principal, serverID, session)
}

// anySessionKey has two parts where latestKey has three, so the two never
// collide in the one map.
func anySessionKey(principal, serverID string) string {
	return encode(principal, serverID)
}

// Held is how many snapshots the store holds now, for the
// capsnap_snapshots_active gauge.
func (m *Memory) Held() int64 { return m.held.Load() }

// RecordCall implements Store. A snapshot this store never held records
// nothing, so a sequence rule over it cannot be satisfied.
func (m *Memory) RecordCall(s *Snapshot, tool string) {
	c := s.calls
	if c == nil || !m.now().Before(s.ValidUntil) {
		return
	}
	c.mu.Lock()
	if c.done == nil {
		// Most snapshots are listed and never called under.
		c.done = map[string]struct{}{}
	}
	c.done[tool] = struct{}{}
	c.mu.Unlock()
}

// Called implements Store.
func (m *Memory) Called(s *Snapshot, tool string) bool {
	c := s.calls
	if c == nil {
		return false
	}
	c.mu.Lock()
	_, ok := c.done[tool]
	c.mu.Unlock()
	return ok
}

// NewEpoch returns an unguessable opaque epoch: 128 random bits.
func NewEpoch() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return "ep_" + base64.RawURLEncoding.EncodeToString(b[:])
}
