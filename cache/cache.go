// Package cache holds capability snapshots: the immutable records minted
// when a principal discovers a server's tools, which its later tool calls
// are verified against.
//
// Each pinned tool is stored under the full (server_id, tool_id,
// schema_digest, principal) tuple of the snapshot that pinned it, so a call
// finds its pin only if every element matches: a same-named tool on another
// server, another digest or another principal is simply not there. The
// snapshot itself is found by its epoch. Memory is bounded (ristretto) and
// every entry expires at its snapshot's valid_until.
package cache

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
}

// Snapshot is what one principal was authorized against on one server.
type Snapshot struct {
	Epoch      string
	Principal  string
	ServerID   string
	Session    string
	ObservedAt time.Time
	ValidUntil time.Time
	// CatalogGeneration is the generation of the live catalog the pins
	// were taken from.
	CatalogGeneration uint64
	Pins              map[string]Pin // by tool_id
}

// Key is the identity of one pinned tool. A tool is never looked up by its
// name alone.
type Key struct {
	ServerID, ToolID, SchemaDigest, Principal, Epoch string
}

// String encodes the key unambiguously: each element is length-prefixed, so
// no choice of names can make two different keys encode alike.
func (k Key) String() string {
	return encode(k.ServerID, k.ToolID, k.SchemaDigest, k.Principal, k.Epoch)
}

func encode(parts ...string) string {
	var b strings.Builder
	for _, s := range parts {
		b.WriteString(strconv.Itoa(len(s)))
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
	// Pinned returns the pin stored under exactly k.
	Pinned(k Key) (Pin, bool)
	// RecordCall notes that a call to tool was allowed under snapshot s,
	// for the policy's sequence rules; Called asks.
	RecordCall(s *Snapshot, tool string)
	Called(epoch, tool string) bool
}

var _ Store = (*Memory)(nil)

// Memory is the in-process Store of a single replica.
type Memory struct {
	pins      *ristretto.Cache[string, Pin]
	snapshots *ristretto.Cache[string, *Snapshot]
	// latest maps (principal, server, session) to its newest epoch, and
	// expires with that snapshot.
	latest *ristretto.Cache[string, string]
	// calls holds the (epoch, tool) pairs allowed so far, and expires
	// with the snapshot.
	calls  *ristretto.Cache[string, struct{}]
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
	pins, err := ristretto.NewCache(&ristretto.Config[string, Pin]{
		NumCounters: 10 * o.MaxSnapshots * pinsPerSnapshot, MaxCost: o.MaxSnapshots * pinsPerSnapshot, BufferItems: 64,
	})
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	m := &Memory{retain: o.Retain, now: o.Now}
	snaps, err := ristretto.NewCache(&ristretto.Config[string, *Snapshot]{
		NumCounters: 10 * o.MaxSnapshots, MaxCost: o.MaxSnapshots, BufferItems: 64,
		// Expiry and eviction both come through here.
		OnEvict: func(*ristretto.Item[*Snapshot]) { m.held.Add(-1) },
	})
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	latest, err := ristretto.NewCache(&ristretto.Config[string, string]{
		NumCounters: 10 * o.MaxSnapshots, MaxCost: o.MaxSnapshots, BufferItems: 64,
	})
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	calls, err := ristretto.NewCache(&ristretto.Config[string, struct{}]{
		NumCounters: 10 * o.MaxSnapshots * pinsPerSnapshot, MaxCost: o.MaxSnapshots * pinsPerSnapshot, BufferItems: 64,
	})
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	m.pins, m.snapshots, m.latest, m.calls = pins, snaps, latest, calls
	return m, nil
}

// pinsPerSnapshot sizes the pin cache: the typical number of tools a
// snapshot pins, not a limit.
const pinsPerSnapshot = 16

// Close releases the store's goroutines.
func (m *Memory) Close() {
	m.pins.Close()
	m.snapshots.Close()
	m.latest.Close()
	m.calls.Close()
}

// Put implements Store.
func (m *Memory) Put(s *Snapshot) error {
	ttl := s.ValidUntil.Sub(m.now())
	if ttl <= 0 {
		return fmt.Errorf("cache: snapshot %s is already expired", s.Epoch)
	}
	ttl += m.retain
	for _, p := range s.Pins {
		k := Key{ServerID: s.ServerID, ToolID: p.ToolID, SchemaDigest: p.SchemaDigest, Principal: s.Principal, Epoch: s.Epoch}
		m.pins.SetWithTTL(k.String(), p, 1, ttl)
	}
	if !m.snapshots.SetWithTTL(s.Epoch, s, 1, ttl) {
		return fmt.Errorf("cache: snapshot %s was not admitted", s.Epoch)
	}
	// ristretto applies sets asynchronously; a snapshot must be findable
	// by the very next request.
	m.pins.Wait()
	m.snapshots.Wait()
	if _, ok := m.snapshots.Get(s.Epoch); !ok {
		return fmt.Errorf("cache: snapshot %s was not admitted", s.Epoch)
	}
	m.held.Add(1)
	m.latest.SetWithTTL(latestKey(s.Principal, s.ServerID, s.Session), s.Epoch, 1, ttl)
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

func latestKey(principal, serverID, session string) string {
	return encode(principal, serverID, session)
}

// Pinned implements Store.
func (m *Memory) Pinned(k Key) (Pin, bool) {
	return m.pins.Get(k.String())
}

// Held is how many snapshots the store holds now, for the
// capsnap_snapshots_active gauge.
func (m *Memory) Held() int64 { return m.held.Load() }

// RecordCall implements Store.
func (m *Memory) RecordCall(s *Snapshot, tool string) {
	ttl := s.ValidUntil.Sub(m.now())
	if ttl <= 0 {
		return
	}
	m.calls.SetWithTTL(encode(s.Epoch, tool), struct{}{}, 1, ttl)
	// A sequence rule checks this on the very next call.
	m.calls.Wait()
}

// Called implements Store.
func (m *Memory) Called(epoch, tool string) bool {
	_, ok := m.calls.Get(encode(epoch, tool))
	return ok
}

// NewEpoch returns an unguessable opaque epoch: 128 random bits.
func NewEpoch() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return "ep_" + base64.RawURLEncoding.EncodeToString(b[:])
}
