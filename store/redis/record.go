package redis

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/capsnap/capsnap/store"
)

// The kinds of record a store writes. Each MAC covers its kind, so a
// record of one kind can never stand for another.
const (
	kindSeq          = "seq"
	kindInvalidation = "invalidation"
	kindSnapshot     = "snapshot"
	kindLatest       = "latest"
	kindCall         = "call"
	kindRedemption   = "redemption"
)

// macLen is the length a MAC is cut to: 128 bits, which no attacker who
// can only write to Redis will guess.
const macLen = 16

// sealer makes and checks the MACs of every record under the key the
// replicas share (snapshots.redis.secret_file).
type sealer struct{ pool sync.Pool }

func newSealer(secret []byte) *sealer {
	key := append([]byte(nil), secret...)
	return &sealer{pool: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}
}

// mac is the MAC of a record of kind with parts, each length-prefixed so
// that no two lists of parts read alike.
func (s *sealer) mac(kind string, parts ...string) string {
	h := s.pool.Get().(hash.Hash)
	h.Reset()
	var n [binary.MaxVarintLen64]byte
	write := func(p string) {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		h.Write([]byte(p))
	}
	write(kind)
	for _, p := range parts {
		write(p)
	}
	var sum [sha256.Size]byte
	out := base64.RawURLEncoding.EncodeToString(h.Sum(sum[:0])[:macLen])
	s.pool.Put(h)
	return out
}

func (s *sealer) verify(got, kind string, parts ...string) bool {
	return hmac.Equal([]byte(got), []byte(s.mac(kind, parts...)))
}

// newIncarnation names a store's contents from the moment they began: a
// Redis that comes back empty gets a new one, and every record of the old
// one fails its MAC.
func newIncarnation() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// seqRecord is the store's invalidation sequence, with the incarnation it
// counts in and a nonce: "<incarnation>.<n>.<nonce>.<mac>". The nonce
// makes each write of the sequence unlike any other, so that a replica
// can tell the n it read from another n written after Redis lost the
// first (a failover to a replica it had not reached), or from an old
// record written back.
func (s *sealer) seqRecord(inc string, n uint64) string {
	ns := strconv.FormatUint(n, 10)
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	nonce := base64.RawURLEncoding.EncodeToString(b[:])
	return inc + "." + ns + "." + nonce + "." + s.mac(kindSeq, inc, ns, nonce)
}

func (s *sealer) openSeq(raw string) (seqMark, error) {
	parts := strings.Split(raw, ".")
	if len(parts) != 4 || !s.verify(parts[3], kindSeq, parts[0], parts[1], parts[2]) {
		return seqMark{}, errors.New("the sequence record fails its MAC")
	}
	n, err := strconv.ParseUint(parts[1], 10, 64)
	return seqMark{raw: raw, incarnation: parts[0], seq: n}, err
}

// invField names tool of server in the invalidation hash.
func invField(server, tool string) string {
	return strconv.Itoa(len(server)) + ":" + server + tool
}

func splitInvField(f string) (server, tool string, ok bool) {
	n, rest, ok := strings.Cut(f, ":")
	l, err := strconv.Atoi(n)
	if !ok || err != nil || l < 0 || l > len(rest) {
		return "", "", false
	}
	return rest[:l], rest[l:], true
}

// invRecord is the sequence at which a tool changed: "<n>.<mac>".
func (s *sealer) invRecord(inc, field string, n uint64) string {
	ns := strconv.FormatUint(n, 10)
	return ns + "." + s.mac(kindInvalidation, inc, field, ns)
}

func (s *sealer) openInv(inc, field, raw string) (uint64, bool) {
	ns, m, ok := strings.Cut(raw, ".")
	if !ok || !s.verify(m, kindInvalidation, inc, field, ns) {
		return 0, false
	}
	n, err := strconv.ParseUint(ns, 10, 64)
	return n, err == nil
}

// pointer is a latest-snapshot key's value: "<epoch>.<mac>", the MAC
// binding the epoch to that key.
func (s *sealer) pointer(inc, key, epoch string) string {
	return epoch + "." + s.mac(kindLatest, inc, key, epoch)
}

func (s *sealer) openPointer(inc, key, raw string) (string, bool) {
	epoch, m, ok := strings.Cut(raw, ".")
	return epoch, ok && s.verify(m, kindLatest, inc, key, epoch)
}

// callMember is a call to tool recorded under epoch.
func (s *sealer) callMember(inc, epoch, tool string) string {
	return s.mac(kindCall, inc, epoch, tool)
}

// snapshotRecord is how a snapshot is written: "<mac>.<json>", the MAC over
// the epoch and the JSON.
type snapshotRecord struct {
	Principal  string      `json:"p"`
	ServerID   string      `json:"s"`
	Session    string      `json:"x,omitempty"`
	ObservedAt int64       `json:"o"`
	ValidUntil int64       `json:"u"`
	Seq        uint64      `json:"q"`
	NextCursor string      `json:"c,omitempty"`
	Pins       []store.Pin `json:"t"`
}

func (s *sealer) sealSnapshot(inc string, snap *store.Snapshot) (string, error) {
	body, err := json.Marshal(snapshotRecord{
		Principal: snap.Principal, ServerID: snap.ServerID, Session: snap.Session,
		ObservedAt: snap.ObservedAt.UnixNano(), ValidUntil: snap.ValidUntil.UnixNano(),
		Seq: snap.Seq, NextCursor: snap.NextCursor, Pins: snap.Pins,
	})
	if err != nil {
		return "", fmt.Errorf("encode snapshot %s: %w", snap.Epoch, err)
	}
	return s.mac(kindSnapshot, inc, snap.Epoch, string(body)) + "." + string(body), nil
}

func (s *sealer) openSnapshot(inc, epoch, raw string) (*store.Snapshot, bool) {
	m, body, ok := strings.Cut(raw, ".")
	if !ok || !s.verify(m, kindSnapshot, inc, epoch, body) {
		return nil, false
	}
	var r snapshotRecord
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return nil, false
	}
	return &store.Snapshot{
		Epoch: epoch, Principal: r.Principal, ServerID: r.ServerID, Session: r.Session,
		ObservedAt: time.Unix(0, r.ObservedAt), ValidUntil: time.Unix(0, r.ValidUntil),
		Seq: r.Seq, NextCursor: r.NextCursor, Pins: r.Pins,
	}, true
}
