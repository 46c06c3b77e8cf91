package testbed

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// The issuer and audience envoy/jwt.yaml's jwt_authn provider accepts.
const (
	JWTIssuer   = "https://idp.acme.example"
	JWTAudience = "https://mcp.acme.example"
)

// Issuer is a throwaway token issuer for one test: an RSA key that signs
// RS256 tokens, published as a JWKS for Envoy's jwt_authn.
type Issuer struct {
	kid string
	key *rsa.PrivateKey
}

// NewIssuer creates an issuer whose key has key ID kid. Two issuers with
// the same kid make a forged token that names a key Envoy trusts.
func NewIssuer(kid string) (*Issuer, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("issuer: %w", err)
	}
	return &Issuer{kid: kid, key: key}, nil
}

// JWKS is the issuer's public key as a JSON Web Key Set (RFC 7517).
func (i *Issuer) JWKS() ([]byte, error) {
	b64 := base64.RawURLEncoding.EncodeToString
	set := map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "use": "sig", "alg": "RS256", "kid": i.kid,
		"n": b64(i.key.N.Bytes()),
		"e": b64(big.NewInt(int64(i.key.E)).Bytes()),
	}}}
	b, err := json.Marshal(set)
	if err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	return b, nil
}

// Claims are the claims of a token Envoy accepts for subject: this
// issuer, this audience, valid for five minutes from now.
func Claims(subject string) jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{
		"iss": JWTIssuer, "aud": JWTAudience, "sub": subject,
		"iat": now.Unix(), "exp": now.Add(5 * time.Minute).Unix(),
	}
}

// Sign signs claims as an RS256 JWT under the issuer's kid.
func (i *Issuer) Sign(claims jwt.MapClaims) (string, error) {
	tok := jwt.NewWithClaims(jwt.SigningMethodRS256, claims)
	tok.Header["kid"] = i.kid
	s, err := tok.SignedString(i.key)
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return s, nil
}
