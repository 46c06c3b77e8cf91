package approval

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"
)

// Authenticator says who holds a bearer token. Every error it returns
// wraps ErrUnauthenticated.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (Approver, error)
}

// ErrUnauthenticated is a token that names no approver: missing, malformed,
// badly signed, expired, or for another issuer or audience.
var ErrUnauthenticated = errors.New("approval: no valid approver token")

func unauthenticated(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnauthenticated, fmt.Sprintf(format, args...))
}

// JWTConfig configures a JWT authenticator.
type JWTConfig struct {
	// JWKSFile or JWKSURL (exactly one) holds the identity provider's
	// public keys. Either is read again, at most every MinRefresh, when a
	// token names a key it does not hold, and every Refresh.
	JWKSFile string
	JWKSURL  string
	// Issuer and Audience are what every token's iss and aud must say.
	Issuer   string
	Audience string
	// IdentityClaim names the approver ("sub" if empty); GroupsClaim their
	// groups ("groups" if empty), a string or an array of strings.
	IdentityClaim string
	GroupsClaim   string
	// Leeway allows for clocks apart, on exp, nbf and iat; 30 s if zero.
	Leeway time.Duration
	// Refresh is how long the keys are used before they are read again;
	// 5 minutes if zero. MinRefresh is the least time between two reads;
	// 10 s if zero.
	Refresh, MinRefresh time.Duration
	// Client fetches JWKSURL; a client with a 10 s timeout if nil.
	Client *http.Client
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// algorithms are the signatures a token may carry: public-key ones only,
// so that no key in the JWKS can be used as an HMAC secret, and never none.
var algorithms = []jose.SignatureAlgorithm{
	jose.EdDSA, jose.ES256, jose.ES384, jose.ES512,
	jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
}

// JWT authenticates approvers by a JWT their identity provider signed.
type JWT struct {
	c JWTConfig

	mu      sync.Mutex
	keys    jose.JSONWebKeySet
	fetched time.Time
}

var _ Authenticator = (*JWT)(nil)

// NewJWT returns a JWT authenticator, having read its keys once.
func NewJWT(c JWTConfig) (*JWT, error) {
	switch {
	case (c.JWKSFile == "") == (c.JWKSURL == ""):
		return nil, errors.New("approval: exactly one of a JWKS file and a JWKS URL is required")
	case c.Issuer == "" || c.Audience == "":
		return nil, errors.New("approval: the approvers' token issuer and audience are required")
	}
	if c.IdentityClaim == "" {
		c.IdentityClaim = "sub"
	}
	if c.GroupsClaim == "" {
		c.GroupsClaim = "groups"
	}
	if c.Leeway == 0 {
		c.Leeway = 30 * time.Second
	}
	if c.Refresh <= 0 {
		c.Refresh = 5 * time.Minute
	}
	if c.MinRefresh <= 0 {
		c.MinRefresh = 10 * time.Second
	}
	if c.Client == nil {
		c.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	j := &JWT{c: c}
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.read(context.Background()); err != nil {
		return nil, err
	}
	return j, nil
}

// read reads the keys; j.mu is held.
func (j *JWT) read(ctx context.Context) error {
	var data []byte
	var err error
	if j.c.JWKSFile != "" {
		data, err = os.ReadFile(j.c.JWKSFile)
	} else {
		data, err = j.fetch(ctx)
	}
	if err != nil {
		return fmt.Errorf("approval: approvers' JWKS: %w", err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(data, &set); err != nil || len(set.Keys) == 0 {
		return fmt.Errorf("approval: approvers' JWKS holds no keys (%v)", err)
	}
	for _, k := range set.Keys {
		if !k.IsPublic() {
			return fmt.Errorf("approval: approvers' JWKS: key %q is not a public key", k.KeyID)
		}
	}
	j.keys, j.fetched = set, j.c.Now()
	return nil
}

func (j *JWT) fetch(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.c.JWKSURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := j.c.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", j.c.JWKSURL, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 1<<20))
}

// keysFor returns the keys that may have signed a token naming kid,
// reading the keys again when they are old, or hold no such key and were
// not read just now.
func (j *JWT) keysFor(ctx context.Context, kid string) []jose.JSONWebKey {
	j.mu.Lock()
	defer j.mu.Unlock()
	age := j.c.Now().Sub(j.fetched)
	if age >= j.c.Refresh || (len(j.match(kid)) == 0 && age >= j.c.MinRefresh) {
		// A failed read keeps the keys in hand: the identity provider
		// being unreachable for a moment is no reason to sign everyone out.
		_ = j.read(ctx)
	}
	return j.match(kid)
}

func (j *JWT) match(kid string) []jose.JSONWebKey {
	if kid == "" {
		return j.keys.Keys
	}
	return j.keys.Key(kid)
}

// Authenticate implements Authenticator.
func (j *JWT) Authenticate(ctx context.Context, token string) (Approver, error) {
	if token == "" {
		return Approver{}, unauthenticated("no token")
	}
	tok, err := jwt.ParseSigned(token, algorithms)
	if err != nil {
		return Approver{}, unauthenticated("%v", err)
	}
	if len(tok.Headers) != 1 {
		return Approver{}, unauthenticated("want one signature")
	}
	var (
		std    jwt.Claims
		claims map[string]any
		ok     bool
	)
	for _, k := range j.keysFor(ctx, tok.Headers[0].KeyID) {
		if tok.Claims(k.Key, &std, &claims) == nil {
			ok = true
			break
		}
	}
	if !ok {
		return Approver{}, unauthenticated("the signature verifies under no key of the JWKS")
	}
	if std.Expiry == nil {
		return Approver{}, unauthenticated("the token has no expiry")
	}
	exp := jwt.Expected{Issuer: j.c.Issuer, AnyAudience: jwt.Audience{j.c.Audience}, Time: j.c.Now()}
	if err := std.ValidateWithLeeway(exp, j.c.Leeway); err != nil {
		return Approver{}, unauthenticated("%v", err)
	}
	id, _ := claims[j.c.IdentityClaim].(string)
	if id == "" {
		return Approver{}, unauthenticated("no %s claim", j.c.IdentityClaim)
	}
	groups, err := stringList(claims[j.c.GroupsClaim])
	if err != nil {
		return Approver{}, unauthenticated("claim %s: %v", j.c.GroupsClaim, err)
	}
	return Approver{ID: id, Groups: groups}, nil
}

func stringList(v any) ([]string, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case string:
		return []string{v}, nil
	case []any:
		out := make([]string, len(v))
		for i, e := range v {
			s, ok := e.(string)
			if !ok {
				return nil, errors.New("not a list of strings")
			}
			out[i] = s
		}
		return out, nil
	}
	return nil, errors.New("neither a string nor a list of strings")
}

// DevTokens authenticates approvers by static tokens from a file: for the
// demo and for development only. Anyone who can read the file can approve
// as anyone in it, and its tokens never expire, so loading it logs a
// warning and the approval page says so on every screen.
//
// The file is YAML:
//
//	tokens:
//	  - token: a-long-random-string   # at least 16 characters
//	    approver: oncall@acme.example
//	    groups: [billing-oncall]
type DevTokens struct {
	byHash map[[sha256.Size]byte]Approver
}

var _ Authenticator = (*DevTokens)(nil)

// minDevToken is the shortest token DevTokens accepts: short ones are
// guessed.
const minDevToken = 16

// LoadDevTokens reads the tokens of path, warning on log that they are
// in force.
func LoadDevTokens(path string, log zerolog.Logger) (*DevTokens, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("approval: dev tokens: %w", err)
	}
	var file struct {
		Tokens []struct {
			Token    string   `yaml:"token"`
			Approver string   `yaml:"approver"`
			Groups   []string `yaml:"groups"`
		} `yaml:"tokens"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		return nil, fmt.Errorf("approval: dev tokens %s: %w", path, err)
	}
	d := &DevTokens{byHash: map[[sha256.Size]byte]Approver{}}
	for i, t := range file.Tokens {
		h := sha256.Sum256([]byte(t.Token))
		switch _, dup := d.byHash[h]; {
		case len(t.Token) < minDevToken:
			return nil, fmt.Errorf("approval: dev tokens %s: tokens[%d]: shorter than %d characters", path, i, minDevToken)
		case t.Approver == "":
			return nil, fmt.Errorf("approval: dev tokens %s: tokens[%d]: no approver", path, i)
		case dup:
			return nil, fmt.Errorf("approval: dev tokens %s: tokens[%d]: the token is listed twice", path, i)
		}
		d.byHash[h] = Approver{ID: t.Approver, Groups: t.Groups}
	}
	if len(d.byHash) == 0 {
		return nil, fmt.Errorf("approval: dev tokens %s: no tokens", path)
	}
	log.Warn().Str("file", path).Int("tokens", len(d.byHash)).
		Msg("APPROVER DEV TOKENS IN FORCE: whoever reads this file approves calls as its approvers; never in production")
	return d, nil
}

// Authenticate implements Authenticator. Tokens are looked up by their
// SHA-256, so the lookup's timing says nothing of a token's bytes.
func (d *DevTokens) Authenticate(_ context.Context, token string) (Approver, error) {
	if token == "" {
		return Approver{}, unauthenticated("no token")
	}
	a, ok := d.byHash[sha256.Sum256([]byte(token))]
	if !ok {
		return Approver{}, unauthenticated("not a development token")
	}
	return a, nil
}

// Development reports that these tokens are for development only: the
// approval page says so.
func (d *DevTokens) Development() bool { return true }
