package envelope

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// Keys are capsnap's signing keys, as a ring that rotates while capsnap
// runs. One key signs; every key is published in the JWKS from when it is
// loaded until nothing it signed can still be verified, so that verifiers
// know a new key before it signs and an old one until its last envelope
// or grant expires.
//
// The key files are the ring's wish: the first should sign, and every one
// listed is published. Reload reads them again. A key new to the ring is
// published at once and signs PublishAhead later; until then the key
// that signed goes on signing. A key no longer listed stays published
// until Outlive after it last signed (at once gone, if it never signed).
// The ring keeps these times in memory: a restart loads the files as
// they are, and the first signs at once.
type Keys struct {
	o     KeyOptions
	files []string
	// mu serialises the ring's changes; state is read without it.
	mu    sync.Mutex
	state atomic.Pointer[ring]
}

// KeyOptions configure how Keys rotate.
type KeyOptions struct {
	// PublishAhead is how long a key new to the ring is published before
	// it signs: at least as long as a verifier keeps a JWKS it fetched.
	PublishAhead time.Duration
	// Outlive is how long a key stays published after it last signed:
	// the longest that anything it signed is valid (under a grant, the
	// snapshot's TTL), and the verifiers' leeway.
	Outlive time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// material is one key and what signs with it.
type material struct {
	kid             string
	private         ed25519.PrivateKey
	jwk             jose.JSONWebKey
	envelope, grant jose.Signer
}

// ringKey is a key in the ring, and its times.
type ringKey struct {
	*material
	// listed: the key files name it.
	listed bool
	// published is when it entered the ring.
	published time.Time
	// stopped is when it last signed; zero if it never has, or signs now.
	stopped time.Time
	// signsFrom is when it takes over, if it is the next signer.
	signsFrom time.Time
	// retires is when it leaves the JWKS, once it is no longer listed.
	retires time.Time
}

// ring is the keys at one moment; it never changes, a change makes
// another.
type ring struct {
	keys []ringKey
	// signer indexes the key that signs; next the one that will, at its
	// signsFrom, or is -1.
	signer, next int
	// at is when the ring changes by itself next (a key takes over, a key
	// retires); zero if never.
	at   time.Time
	jwks []byte
}

// LoadKeys reads Ed25519 private keys, PEM PKCS #8 ("openssl genpkey
// -algorithm ed25519"), one or more per file: the first signs, and every
// one is published. A key's kid is its RFC 7638 thumbprint, so a kid can never
// name two keys. Keys loaded so never rotate (Reload is OpenKeys's).
func LoadKeys(files ...string) (*Keys, error) { return OpenKeys(KeyOptions{}, files...) }

// OpenKeys is LoadKeys for a ring that rotates when Reload finds the files
// changed.
func OpenKeys(o KeyOptions, files ...string) (*Keys, error) {
	if o.PublishAhead < 0 || o.Outlive < 0 {
		return nil, errors.New("envelope: PublishAhead and Outlive cannot be negative")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	listed, err := loadMaterial(files)
	if err != nil {
		return nil, err
	}
	now := o.Now()
	r := &ring{signer: 0, next: -1}
	for _, m := range listed {
		r.keys = append(r.keys, ringKey{material: m, listed: true, published: now})
	}
	k := &Keys{o: o, files: slices.Clone(files)}
	k.state.Store(r.settle(now, o.Outlive))
	return k, nil
}

func loadMaterial(files []string) ([]*material, error) {
	if len(files) == 0 {
		return nil, errors.New("envelope: no key files")
	}
	var out []*material
	for _, f := range files {
		keys, err := readKeys(f)
		if err != nil {
			return nil, err
		}
		for _, priv := range keys {
			m := &material{private: priv, jwk: jose.JSONWebKey{Key: priv.Public(), Algorithm: string(jose.EdDSA), Use: "sig"}}
			if m.kid, err = thumbprint(priv.Public()); err != nil {
				return nil, fmt.Errorf("envelope: %s: %w", f, err)
			}
			m.jwk.KeyID = m.kid
			if slices.ContainsFunc(out, func(o *material) bool { return o.kid == m.kid }) {
				return nil, fmt.Errorf("envelope: %s holds a key listed before it", f)
			}
			if m.envelope, err = m.signer(Type); err != nil {
				return nil, err
			}
			if m.grant, err = m.signer(GrantType); err != nil {
				return nil, err
			}
			out = append(out, m)
		}
	}
	return out, nil
}

// signer signs with m, as a JWS whose "typ" is typ.
func (m *material) signer(typ string) (jose.Signer, error) {
	opts := (&jose.SignerOptions{}).WithType(jose.ContentType(typ)).WithHeader("kid", m.kid)
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: m.private}, opts)
	if err != nil {
		return nil, fmt.Errorf("envelope: %w", err)
	}
	return s, nil
}

// Reload reads the key files again and updates the ring: a key new to it
// is published now and, if listed first, signs PublishAhead from now; a
// key no longer listed retires Outlive after it last signed. Files that
// cannot be read, or hold a key twice, leave the ring as it was. It
// reports whether the ring changed.
func (k *Keys) Reload() (bool, error) {
	listed, err := loadMaterial(k.files)
	if err != nil {
		return false, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.o.Now()
	old := k.advance(now)
	r := old.reload(listed, now, k.o)
	// A key still listed keeps its material: an unchanged ring compares
	// equal.
	if slices.Equal(r.keys, old.keys) && r.signer == old.signer && r.next == old.next {
		return false, nil
	}
	k.state.Store(r)
	return true, nil
}

// current is the ring now: the state, advanced if one of its times has
// come. A ring that never rotates reads no clock.
func (k *Keys) current() *ring {
	r := k.state.Load()
	if r.at.IsZero() {
		return r
	}
	now := k.o.Now()
	if now.Before(r.at) {
		return r
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.advance(now)
}

// advance brings the state to now; k.mu is held.
func (k *Keys) advance(now time.Time) *ring {
	r := k.state.Load()
	if !r.at.IsZero() && !now.Before(r.at) {
		r = r.settle(now, k.o.Outlive)
		k.state.Store(r)
	}
	return r
}

// reload is r with the keys listed now.
func (r *ring) reload(listed []*material, now time.Time, o KeyOptions) *ring {
	out := &ring{signer: -1, next: -1}
	index := map[string]int{}
	for i, key := range r.keys {
		index[key.kid] = i
	}
	for _, m := range listed {
		i, ok := index[m.kid]
		if !ok {
			out.keys = append(out.keys, ringKey{material: m, listed: true, published: now})
			continue
		}
		key := r.keys[i]
		key.listed, key.retires, key.signsFrom = true, time.Time{}, time.Time{}
		out.keys = append(out.keys, key)
		delete(index, m.kid)
	}
	// The keys no longer listed, in the order they had: the one that
	// signs goes on until the next takes over; one that signed stays
	// until what it signed has expired; one that never signed goes.
	for i, key := range r.keys {
		if _, gone := index[key.kid]; !gone {
			continue
		}
		key.listed, key.signsFrom = false, time.Time{}
		switch {
		case i == r.signer:
		case key.stopped.IsZero():
			continue
		default:
			key.retires = key.stopped.Add(o.Outlive)
		}
		out.keys = append(out.keys, key)
	}
	for i, key := range out.keys {
		if key.kid == r.keys[r.signer].kid {
			out.signer = i
		}
	}
	if want := &out.keys[0]; want.kid != out.keys[out.signer].kid {
		out.next = 0
		want.signsFrom = want.published.Add(o.PublishAhead)
	}
	return out.settle(now, o.Outlive)
}

// settle applies what is due at now, and works out the JWKS and the next
// time the ring changes by itself; a signer no longer listed that stops
// now retires outlive later.
func (r *ring) settle(now time.Time, outlive time.Duration) *ring {
	out := &ring{keys: slices.Clone(r.keys), signer: r.signer, next: r.next}
	if out.next >= 0 && !now.Before(out.keys[out.next].signsFrom) {
		old := &out.keys[out.signer]
		old.stopped = now
		if !old.listed {
			old.retires = now.Add(outlive)
		}
		out.keys[out.next].signsFrom, out.keys[out.next].stopped = time.Time{}, time.Time{}
		out.signer, out.next = out.next, -1
	}
	signer, next := out.keys[out.signer].kid, ""
	if out.next >= 0 {
		next = out.keys[out.next].kid
	}
	out.keys = slices.DeleteFunc(out.keys, func(k ringKey) bool {
		return !k.listed && !k.retires.IsZero() && !now.Before(k.retires)
	})
	set := jose.JSONWebKeySet{}
	out.signer, out.next = -1, -1
	for i, k := range out.keys {
		set.Keys = append(set.Keys, k.jwk)
		switch k.kid {
		case signer:
			out.signer = i
		case next:
			out.next = i
			out.at = earliest(out.at, k.signsFrom)
		}
		if !k.listed {
			out.at = earliest(out.at, k.retires)
		}
	}
	b, err := json.Marshal(set)
	if err != nil {
		panic(fmt.Sprintf("envelope: marshal a JWKS of Ed25519 keys: %v", err)) // cannot happen
	}
	out.jwks = b
	return out
}

// earliest is the earlier of a and b, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// KeyID is the kid of the key that signs now.
func (k *Keys) KeyID() string {
	r := k.current()
	return r.keys[r.signer].kid
}

// JWKS is the public keys published now, as a JSON Web Key Set.
func (k *Keys) JWKS() []byte { return k.current().jwks }

// signing is the key that signs now.
func (k *Keys) signing() *material {
	r := k.current()
	return r.keys[r.signer].material
}

// KeyStatus is a key in the ring, for an operator: whether it signs, when
// it will if it is next, and when it leaves the JWKS if it is retiring.
type KeyStatus struct {
	KeyID     string    `json:"kid"`
	Signs     bool      `json:"signs"`
	SignsFrom time.Time `json:"signs_from,omitzero"`
	Retires   time.Time `json:"retires,omitzero"`
}

// Status is every key published now, in the JWKS's order.
func (k *Keys) Status() []KeyStatus {
	r := k.current()
	out := make([]KeyStatus, len(r.keys))
	for i, key := range r.keys {
		out[i] = KeyStatus{KeyID: key.kid, Signs: i == r.signer, SignsFrom: key.signsFrom, Retires: key.retires}
	}
	return out
}
