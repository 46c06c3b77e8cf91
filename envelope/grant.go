package envelope

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash"
	"strconv"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// A grant is the half of an envelope that is the same for every call of
// one tool under one snapshot, signed once (EdDSA) and sent beside each
// call's envelope. It carries a fresh call key encrypted to the server
// (JWE, ECDH-ES on P-256), and each call's envelope is then a JWS under
// that key (HS256) binding only what is per call: the arguments, the
// request id, the jti and the expiry. capsnap signs once per snapshot and
// tool instead of once per call; the server decrypts the call key once per
// grant. Only capsnap and the server the grant is for can make a call's
// envelope, so the per-call binding holds against everyone between them.
// docs/ENVELOPE.md is the format.

// GrantHeader is the request header that carries the grant an envelope
// is under.
const GrantHeader = "x-capsnap-grant"

// GrantType is a grant's "typ" header.
const GrantType = "capsnap-grant+jwt"

// CallType is the "typ" header of an envelope under a grant.
const CallType = "capsnap-call+jwt"

// callKeySize is the size of a call key: HS256's own.
const callKeySize = 32

// GrantClaims are what a grant says.
type GrantClaims struct {
	Issuer       string `json:"iss"`
	Audience     string `json:"aud"`
	Subject      string `json:"sub"`
	IssuedAt     int64  `json:"iat"`
	Expiry       int64  `json:"exp"`
	ID           string `json:"jti"`
	Epoch        string `json:"epoch"`
	Tool         string `json:"tool"`
	SchemaDigest string `json:"schema_digest"`
	EffectClass  string `json:"effect_class"`
	PolicyDigest string `json:"policy_digest"`
	// CallKey is the compact JWE of the call key, to the server's grant
	// key.
	CallKey string `json:"call_key"`
}

// CallClaims are what an envelope under a grant says.
type CallClaims struct {
	Grant      string          `json:"grant"`
	IssuedAt   int64           `json:"iat"`
	Expiry     int64           `json:"exp"`
	ID         string          `json:"jti"`
	ArgsDigest string          `json:"args_digest"`
	RequestID  json.RawMessage `json:"rid"`
}

// Recipient is the public half of a server's grant key: what capsnap
// encrypts the call keys of that server's grants to.
type Recipient struct {
	enc jose.Encrypter
}

// LoadRecipient reads a server's grant key, a P-256 public key (PEM
// "PUBLIC KEY", as "openssl pkey -pubout" writes). Its kid is its RFC 7638
// thumbprint, which the server finds its private half by.
func LoadRecipient(file string) (*Recipient, error) {
	der, err := readFirstPEM(file, "PUBLIC KEY", ", as openssl pkey -pubout writes")
	if err != nil {
		return nil, err
	}
	key, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("envelope: %s: %w", file, err)
	}
	pub, ok := key.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, fmt.Errorf("envelope: %s: a %T key, want P-256", file, key)
	}
	kid, err := thumbprint(pub)
	if err != nil {
		return nil, fmt.Errorf("envelope: %s: %w", file, err)
	}
	enc, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{Algorithm: jose.ECDH_ES, Key: pub, KeyID: kid}, nil)
	if err != nil {
		return nil, fmt.Errorf("envelope: %s: %w", file, err)
	}
	return &Recipient{enc: enc}, nil
}

func thumbprint(key any) (string, error) {
	tp, err := (&jose.JSONWebKey{Key: key}).Thumbprint(crypto.SHA256)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(tp), nil
}

// Grant is a signed grant and its call key, which seals the envelopes of
// the calls under it.
type Grant struct {
	// Token is the grant as sent, in GrantHeader.
	Token  string
	Claims GrantClaims
	// header is the envelopes' protected header, encoded, and its ".".
	header []byte
	// seals are sealers under the call key, reused: keying an HMAC costs
	// two hash blocks and four allocations.
	seals sync.Pool
}

// Grant signs g as a grant to r, with a fresh call key; g.Issuer,
// g.CallKey and, if empty, g.ID are set.
func (k *Keys) Grant(g GrantClaims, r *Recipient) (*Grant, error) {
	key := make([]byte, callKeySize)
	_, _ = rand.Read(key) // crypto/rand.Read never fails on supported platforms
	jwe, err := r.enc.Encrypt(key)
	if err != nil {
		return nil, fmt.Errorf("envelope: encrypt a call key: %w", err)
	}
	if g.CallKey, err = jwe.CompactSerialize(); err != nil {
		return nil, fmt.Errorf("envelope: %w", err)
	}
	g.Issuer = Issuer
	if g.ID == "" {
		g.ID = NewID()
	}
	payload, err := json.Marshal(g)
	if err != nil {
		return nil, fmt.Errorf("envelope: %w", err)
	}
	token, err := signCompact(k.signing().grant, payload)
	if err != nil {
		return nil, err
	}
	header, err := json.Marshal(struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
		Typ string `json:"typ"`
	}{string(jose.HS256), g.ID, CallType})
	if err != nil {
		return nil, fmt.Errorf("envelope: %w", err)
	}
	out := &Grant{Token: token, Claims: g, header: append(base64.RawURLEncoding.AppendEncode(nil, header), '.')}
	out.seals.New = func() any { return &sealer{mac: hmac.New(sha256.New, key)} }
	return out, nil
}

// Seal makes the envelope of one call under the grant, a compact HS256
// JWS under its call key; c.Grant is set, and c.ID if it is empty.
//
// It is put together here rather than by go-jose, which verifies it
// everywhere: this runs on every allowed call, and go-jose's general
// signer (a header map marshalled per call) costs ten times the HMAC.
func (g *Grant) Seal(c *CallClaims) (string, error) {
	c.Grant = g.Claims.ID
	// A new jti is made here and ends in the token's string, which holds
	// both: one allocation for the two, on every allowed call.
	var idBuf [idLen]byte
	jti := append(idBuf[:0], c.ID...)
	fresh := c.ID == ""
	if fresh {
		jti = appendNewID(jti)
	}
	var buf [256]byte
	payload, ok := c.appendJSON(buf[:0], jti)
	if !ok {
		if fresh {
			c.ID, fresh = string(jti), false
		}
		// A copy: marshalling c itself would move every call's claims to
		// the heap, for this path that almost none takes.
		cc := *c
		var err error
		if payload, err = json.Marshal(&cc); err != nil {
			return "", fmt.Errorf("envelope: %w", err)
		}
	}
	enc := base64.RawURLEncoding
	s := g.seals.Get().(*sealer)
	defer g.seals.Put(s)
	token := append(s.buf[:0], g.header...)
	token = enc.AppendEncode(token, payload)
	s.mac.Reset()
	s.mac.Write(token)
	token = append(token, '.')
	token = enc.AppendEncode(token, s.mac.Sum(s.sum[:0]))
	n := len(token)
	if fresh {
		token = append(token, jti...)
	}
	out := string(token)
	if cap(token) <= maxKeptToken {
		s.buf = token
	}
	if fresh {
		c.ID = out[n:]
	}
	return out[:n], nil
}

// maxKeptToken bounds the room a sealer keeps: a token is a few hundred
// bytes but for a request id that is not.
const maxKeptToken = 4096

// sealer is what sealing one call needs besides its claims: the keyed
// HMAC, and room for its sum and the token, kept between calls.
type sealer struct {
	mac hash.Hash
	sum [sha256.Size]byte
	buf []byte
}

// appendJSON appends what json.Marshal makes of c with jti for its ID,
// byte for byte, when every string in it is made of characters JSON writes
// as they are (ids, digests) and its rid is an integer or such a string;
// otherwise it returns false, and the caller marshals. Every allowed call
// under a grant is sealed, and encoding/json's reflection was a third of
// it.
func (c *CallClaims) appendJSON(b, jti []byte) ([]byte, bool) {
	if !plain(c.Grant) || !plain(jti) || !plain(c.ArgsDigest) || !plainID(c.RequestID) {
		return b, false
	}
	b = append(b, `{"grant":"`...)
	b = append(b, c.Grant...)
	b = append(b, `","iat":`...)
	b = strconv.AppendInt(b, c.IssuedAt, 10)
	b = append(b, `,"exp":`...)
	b = strconv.AppendInt(b, c.Expiry, 10)
	b = append(b, `,"jti":"`...)
	b = append(b, jti...)
	b = append(b, `","args_digest":"`...)
	b = append(b, c.ArgsDigest...)
	b = append(b, `","rid":`...)
	if len(c.RequestID) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, c.RequestID...)
	}
	return append(b, '}'), true
}

// plain reports whether s is made only of letters, digits and "-_.:",
// which JSON writes as they are.
func plain[T ~string | ~[]byte](s T) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.', c == ':':
		default:
			return false
		}
	}
	return true
}

// plainID reports whether a JSON-RPC id is absent, an integer, or a
// string of plain characters: JSON text json.Marshal keeps as it is.
func plainID(id json.RawMessage) bool {
	switch {
	case len(id) == 0:
		return true
	case len(id) >= 2 && id[0] == '"' && id[len(id)-1] == '"':
		return plain(id[1 : len(id)-1])
	}
	digits := id
	if digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || (digits[0] == '0' && len(digits) > 1) {
		return false
	}
	for _, d := range digits {
		if d < '0' || d > '9' {
			return false
		}
	}
	return true
}

// readGrantKey reads a server's grant key, a P-256 private key (PEM PKCS
// #8, as "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256"
// writes), and its kid.
func readGrantKey(file string) (*ecdsa.PrivateKey, string, error) {
	key, err := readPrivateKey(file, "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256")
	if err != nil {
		return nil, "", err
	}
	priv, ok := key.(*ecdsa.PrivateKey)
	if !ok || priv.Curve != elliptic.P256() {
		return nil, "", fmt.Errorf("envelope: %s: a %T key, want P-256", file, key)
	}
	kid, err := thumbprint(priv.Public())
	if err != nil {
		return nil, "", fmt.Errorf("envelope: %s: %w", file, err)
	}
	return priv, kid, nil
}

// openGrant is a grant whose signature verified and whose call key was
// decrypted.
type openGrant struct {
	claims GrantClaims
	key    []byte
}

// maxGrants bounds the grants a verifier keeps open: past it, it starts
// over, and each grant in use costs one more signature check.
const maxGrants = 4096

// grantCache keeps the grants a verifier opened until they expire, by
// their exact token, so that each is checked and decrypted once.
type grantCache struct {
	mu sync.Mutex
	m  map[string]*openGrant
}

func (c *grantCache) get(token string) *openGrant {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[token]
}

func (c *grantCache) put(token string, g *openGrant, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxGrants {
		for t, old := range c.m {
			if now.Unix() > old.claims.Expiry {
				delete(c.m, t)
			}
		}
		if c.m == nil || len(c.m) >= maxGrants {
			c.m = map[string]*openGrant{}
		}
	}
	c.m[token] = g
}

// underGrant opens an envelope under a grant: the grant's signature, its
// call key, and the envelope's MAC under that key.
func (v *Verifier) underGrant(grantToken, token string) (*Claims, error) {
	g, err := v.openGrant(grantToken)
	if err != nil {
		return nil, err
	}
	jws, h, err := parseOne(token, jose.HS256, CallType)
	if err != nil {
		return nil, err
	}
	if h.KeyID != g.claims.ID {
		return nil, refuse(Invalid, "the envelope is under grant %q, not the grant sent (%q)", h.KeyID, g.claims.ID)
	}
	payload, err := jws.Verify(g.key)
	if err != nil {
		return nil, refuse(Invalid, "the envelope's MAC does not verify under grant %q's call key", g.claims.ID)
	}
	var c CallClaims
	if err := decodeStrict(payload, &c); err != nil {
		return nil, err
	}
	if c.Grant != g.claims.ID {
		return nil, refuse(Invalid, "the envelope names grant %q, not %q", c.Grant, g.claims.ID)
	}
	gc := g.claims
	return &Claims{
		Issuer: gc.Issuer, Audience: gc.Audience, Subject: gc.Subject,
		IssuedAt: c.IssuedAt, Expiry: min(c.Expiry, gc.Expiry), ID: c.ID,
		Epoch: gc.Epoch, Tool: gc.Tool, SchemaDigest: gc.SchemaDigest,
		EffectClass: gc.EffectClass, PolicyDigest: gc.PolicyDigest,
		ArgsDigest: c.ArgsDigest, RequestID: c.RequestID, Grant: gc.ID,
	}, nil
}

// openGrant checks a grant's signature and decrypts its call key, once
// per grant.
func (v *Verifier) openGrant(token string) (*openGrant, error) {
	if g := v.grants.get(token); g != nil {
		return g, nil
	}
	payload, err := v.verifySigned(token, GrantType)
	if err != nil {
		return nil, err
	}
	var gc GrantClaims
	if err := decodeStrict(payload, &gc); err != nil {
		return nil, err
	}
	if gc.ID == "" || gc.CallKey == "" {
		return nil, refuse(Invalid, "a grant claim is missing")
	}
	if gc.Issuer != Issuer || gc.Audience != v.o.Audience {
		return nil, refuse(Foreign, "a grant issued by %q for %q; this is %q", gc.Issuer, gc.Audience, v.o.Audience)
	}
	jwe, err := jose.ParseEncryptedCompact(gc.CallKey, []jose.KeyAlgorithm{jose.ECDH_ES}, []jose.ContentEncryption{jose.A256GCM})
	if err != nil {
		return nil, refuse(Invalid, "the grant's call key is not a compact ECDH-ES/A256GCM JWE: %v", err)
	}
	priv, ok := v.grantKeys[jwe.Header.KeyID]
	if !ok {
		return nil, refuse(Invalid, "the grant's call key is for grant key %q, which this server does not hold", jwe.Header.KeyID)
	}
	key, err := jwe.Decrypt(priv)
	if err != nil || len(key) != callKeySize {
		return nil, refuse(Invalid, "the grant's call key does not decrypt under grant key %q", jwe.Header.KeyID)
	}
	g := &openGrant{claims: gc, key: key}
	v.grants.put(token, g, v.o.Now())
	return g, nil
}

// Says reports whether the grant says what want does, but for its iat,
// jti and call key.
func (g *Grant) Says(want GrantClaims) bool {
	c := g.Claims
	want.IssuedAt, want.ID, want.CallKey, want.Issuer = c.IssuedAt, c.ID, c.CallKey, c.Issuer
	return c == want
}
