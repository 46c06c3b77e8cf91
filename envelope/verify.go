package envelope

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// Reason is why a verifier refuses a call: the data.reason of its
// JSON-RPC error.
type Reason string

// The refusals, as docs/ENVELOPE.md lists them.
const (
	Missing  Reason = "envelope_missing"
	Invalid  Reason = "envelope_invalid"
	Expired  Reason = "envelope_expired"
	Foreign  Reason = "envelope_foreign"
	Replayed Reason = "envelope_replayed"
	Mismatch Reason = "envelope_mismatch"
)

// Error is a refusal.
type Error struct {
	Reason Reason
	Detail string
}

func (e *Error) Error() string { return string(e.Reason) + ": " + e.Detail }

func refuse(r Reason, format string, args ...any) *Error {
	return &Error{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// Call is what the handler is about to run, which the envelope must be
// about.
type Call struct {
	Tool      string
	Arguments json.RawMessage
	// RequestID is the JSON-RPC id as JSON text, if the SDK exposes it;
	// nil skips the check.
	RequestID json.RawMessage
}

// VerifierOptions configure a Verifier. Exactly one of JWKSFile and
// JWKSURL.
type VerifierOptions struct {
	// Audience is the server_id of the server the verifier guards.
	Audience string
	JWKSFile string
	JWKSURL  string
	// Refresh is how long a JWKS fetched from JWKSURL is kept; an unknown
	// kid fetches it again at most once a second. Zero means 5m.
	Refresh time.Duration
	Client  *http.Client
	// GrantKeyFiles are the server's grant keys, P-256 private keys (PEM
	// PKCS #8), several during a rotation: a grant's call key is
	// decrypted with the one its kid names. Without any, a call under a
	// grant is refused and only envelopes signed whole are taken.
	GrantKeyFiles []string
	// Leeway allows for clock skew with capsnap at exp; zero means 5s.
	Leeway time.Duration
	Now    func() time.Time
}

// Verifier checks envelopes for one server.
type Verifier struct {
	o VerifierOptions

	mu        sync.Mutex
	keys      *jose.JSONWebKeySet
	fetchedAt time.Time
	// seen maps each jti accepted to its exp, until then; pruned is when
	// those past it were last dropped.
	seen   map[string]int64
	pruned time.Time

	grantKeys map[string]*ecdsa.PrivateKey
	grants    grantCache
}

// NewVerifier loads the JWKS (from a URL, on first use) and returns a
// Verifier.
func NewVerifier(o VerifierOptions) (*Verifier, error) {
	switch {
	case o.Audience == "":
		return nil, errors.New("envelope: a verifier needs its server's id (audience)")
	case (o.JWKSFile == "") == (o.JWKSURL == ""):
		return nil, errors.New("envelope: give a verifier exactly one of a JWKS file and a JWKS URL")
	}
	if o.Refresh <= 0 {
		o.Refresh = 5 * time.Minute
	}
	if o.Leeway <= 0 {
		o.Leeway = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 5 * time.Second}
	}
	v := &Verifier{o: o, seen: map[string]int64{}, grantKeys: map[string]*ecdsa.PrivateKey{}}
	for _, f := range o.GrantKeyFiles {
		key, kid, err := readGrantKey(f)
		if err != nil {
			return nil, err
		}
		v.grantKeys[kid] = key
	}
	if o.JWKSFile != "" {
		data, err := os.ReadFile(o.JWKSFile)
		if err != nil {
			return nil, fmt.Errorf("envelope: %w", err)
		}
		if v.keys, err = parseJWKS(data); err != nil {
			return nil, fmt.Errorf("envelope: %s: %w", o.JWKSFile, err)
		}
	}
	return v, nil
}

// ParseJWKS reads a JSON Web Key Set of Ed25519 public keys.
func parseJWKS(data []byte) (*jose.JSONWebKeySet, error) {
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("JWKS: %w", err)
	}
	for _, k := range set.Keys {
		if !k.IsPublic() || k.KeyID == "" {
			return nil, errors.New("JWKS: every key must be a public key with a kid")
		}
	}
	return &set, nil
}

// key finds kid's key, fetching the JWKS again if it comes from a URL and
// is old, or lacks kid and was not fetched in the last second.
func (v *Verifier) key(kid string) (*jose.JSONWebKey, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.o.Now()
	if v.o.JWKSURL != "" {
		since := now.Sub(v.fetchedAt)
		// A kid not in the set may be a key capsnap rotated to; no set at
		// all, a fetch that failed. Either is tried again at most once a
		// second; an attempt, failed or not, counts as a fetch.
		stale := v.fetchedAt.IsZero() || since > v.o.Refresh ||
			since > time.Second && (v.keys == nil || len(v.keys.Key(kid)) == 0)
		if stale {
			v.fetchedAt = now
			if err := v.fetch(); err != nil && v.keys == nil {
				return nil, refuse(Invalid, "%v", err)
			}
		}
		if v.keys == nil {
			return nil, refuse(Invalid, "the JWKS at %s could not be fetched", v.o.JWKSURL)
		}
	}
	if ks := v.keys.Key(kid); len(ks) == 1 {
		return &ks[0], nil
	}
	return nil, refuse(Invalid, "no key %q in the JWKS", kid)
}

func (v *Verifier) fetch() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.o.JWKSURL, nil)
	if err != nil {
		return fmt.Errorf("envelope: JWKS: %w", err)
	}
	resp, err := v.o.Client.Do(req)
	if err != nil {
		return fmt.Errorf("envelope: JWKS: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("envelope: JWKS: %s answered %s", v.o.JWKSURL, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("envelope: JWKS: %w", err)
	}
	set, err := parseJWKS(data)
	if err != nil {
		return fmt.Errorf("envelope: %s: %w", v.o.JWKSURL, err)
	}
	v.keys = set
	return nil
}

// Presented is what a request carries: its envelope, and the grant the
// envelope is under if capsnap sent one.
type Presented struct {
	Envelope string // the x-capsnap-envelope header
	Grant    string // the x-capsnap-grant header
}

// Verify checks what the request presents as the envelope of call, and
// returns its claims (a grant's merged with its envelope's). A refusal is
// an *Error. The schema digest is the caller's to compare: only it knows
// its handler's definition.
func (v *Verifier) Verify(p Presented, call Call) (*Claims, error) {
	if p.Envelope == "" {
		return nil, refuse(Missing, "the call carries no %s header", Header)
	}
	var c *Claims
	var err error
	if p.Grant == "" {
		c, err = v.whole(p.Envelope)
	} else {
		c, err = v.underGrant(p.Grant, p.Envelope)
	}
	if err != nil {
		return nil, err
	}
	switch {
	case c.ID == "" || c.Tool == "" || c.SchemaDigest == "" || c.ArgsDigest == "" || c.Expiry == 0:
		return nil, refuse(Invalid, "a claim is missing")
	case c.Issuer != Issuer || c.Audience != v.o.Audience:
		return nil, refuse(Foreign, "issued by %q for %q; this is %q", c.Issuer, c.Audience, v.o.Audience)
	}
	now := v.o.Now()
	if now.After(time.Unix(c.Expiry, 0).Add(v.o.Leeway)) {
		return nil, refuse(Expired, "expired at %s", time.Unix(c.Expiry, 0).UTC().Format(time.RFC3339))
	}
	if c.Tool != call.Tool {
		return nil, refuse(Mismatch, "the envelope is for tool %q, the call is to %q", c.Tool, call.Tool)
	}
	args, err := ArgsDigest(call.Arguments)
	if err != nil {
		return nil, refuse(Mismatch, "%v", err)
	}
	if args != c.ArgsDigest {
		return nil, refuse(Mismatch, "the envelope binds arguments %s, the call has %s", c.ArgsDigest, args)
	}
	if call.RequestID != nil && !bytes.Equal(bytes.TrimSpace(call.RequestID), bytes.TrimSpace(c.RequestID)) {
		return nil, refuse(Mismatch, "the envelope is for request %s, this is %s", c.RequestID, call.RequestID)
	}
	if err := v.remember(c.ID, c.Expiry, now); err != nil {
		return nil, err
	}
	return c, nil
}

// whole opens an envelope signed whole, without a grant.
func (v *Verifier) whole(token string) (*Claims, error) {
	payload, err := v.verifySigned(token, Type)
	if err != nil {
		return nil, err
	}
	var c Claims
	if err := decodeStrict(payload, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// verifySigned checks token as a compact EdDSA JWS of type typ under a
// key of the JWKS, and returns its payload.
func (v *Verifier) verifySigned(token, typ string) ([]byte, error) {
	jws, h, err := parseOne(token, jose.EdDSA, typ)
	if err != nil {
		return nil, err
	}
	key, err := v.key(h.KeyID)
	if err != nil {
		return nil, err
	}
	payload, err := jws.Verify(key)
	if err != nil {
		return nil, refuse(Invalid, "the signature does not verify under key %q", h.KeyID)
	}
	return payload, nil
}

// parseOne parses token as a compact JWS of one signature, by alg, of
// type typ, and returns it and its protected header.
func parseOne(token string, alg jose.SignatureAlgorithm, typ string) (*jose.JSONWebSignature, jose.Header, error) {
	jws, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{alg})
	if err != nil {
		return nil, jose.Header{}, refuse(Invalid, "not a compact %s JWS: %v", alg, err)
	}
	if len(jws.Signatures) != 1 {
		return nil, jose.Header{}, refuse(Invalid, "%d signatures, want one", len(jws.Signatures))
	}
	h := jws.Signatures[0].Protected
	if got, _ := h.ExtraHeaders[jose.HeaderType].(string); got != typ {
		return nil, jose.Header{}, refuse(Invalid, "typ %q, want %q", got, typ)
	}
	return jws, h, nil
}

// decodeStrict reads claims that must have no member but those named.
func decodeStrict(payload []byte, into any) error {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return refuse(Invalid, "claims: %v", err)
	}
	return nil
}

// remember refuses a jti seen before, and forgets those past their exp.
func (v *Verifier) remember(jti string, exp int64, now time.Time) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.seen[jti]; ok {
		return refuse(Replayed, "envelope %s was already used", jti)
	}
	if now.Sub(v.pruned) > time.Second {
		cutoff := now.Add(-v.o.Leeway).Unix()
		for id, e := range v.seen {
			if e < cutoff {
				delete(v.seen, id)
			}
		}
		v.pruned = now
	}
	v.seen[jti] = exp
	return nil
}
