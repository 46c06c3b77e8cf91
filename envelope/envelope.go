// Package envelope makes and checks capsnap's envelope: the compact JWS
// (EdDSA) an allowed tools/call carries to the MCP server, binding the call
// capsnap authorized to the contract it was authorized against, so that the
// server's handler can check, before any side effect, that it is about to
// run exactly that call. docs/ENVELOPE.md is the format.
//
// JWS is made and checked with go-jose (github.com/go-jose/go-jose/v4): the
// maintained JOSE library of the Go ecosystem, whose parsers take an
// allowlist of algorithms, so that neither "none" nor an HMAC keyed with a
// public key can pass for EdDSA.
package envelope

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"

	jose "github.com/go-jose/go-jose/v4"
)

// Header is the request header that carries the envelope.
const Header = "x-capsnap-envelope"

// Type is the envelope's "typ" header: a JWS of another type, even one
// signed by the same key (an audit checkpoint), is never an envelope.
const Type = "capsnap-envelope+jwt"

// Issuer is the "iss" of every envelope.
const Issuer = "capsnap"

// Claims are what an envelope says; docs/ENVELOPE.md says what each means.
type Claims struct {
	Issuer       string          `json:"iss"`
	Audience     string          `json:"aud"`
	Subject      string          `json:"sub"`
	IssuedAt     int64           `json:"iat"`
	Expiry       int64           `json:"exp"`
	ID           string          `json:"jti"`
	Epoch        string          `json:"epoch"`
	Tool         string          `json:"tool"`
	SchemaDigest string          `json:"schema_digest"`
	EffectClass  string          `json:"effect_class"`
	PolicyDigest string          `json:"policy_digest"`
	ArgsDigest   string          `json:"args_digest"`
	RequestID    json.RawMessage `json:"rid"`
	// Grant is the jti of the grant the envelope is under, if any.
	Grant string `json:"-"`
}

// ArgsDigest is the digest an envelope binds a call's arguments by: SHA-256
// of their RFC 8785 canonical form, "{}" when the call has none (empty,
// only JSON whitespace, or null). Canonical, not the bytes as sent: an SDK
// hands a handler its arguments parsed, and capsnap refuses every body two
// parsers could read differently. The canonical form is written by
// canonical.go into a pooled buffer; it is byte for byte jcs.Transform's.
func ArgsDigest(args json.RawMessage) (string, error) {
	c := canonPool.Get().(*canon)
	defer c.release()
	var err error
	if c.out, err = canonicalArgs(c, c.out[:0], args); err != nil {
		return "", fmt.Errorf("envelope: canonicalize arguments: %w", err)
	}
	sum := sha256.Sum256(c.out)
	const prefix = "sha256:"
	var digest [len(prefix) + 2*sha256.Size]byte
	copy(digest[:], prefix)
	hex.Encode(digest[len(prefix):], sum[:])
	return string(digest[:]), nil
}

// readKeys reads the Ed25519 keys in file, PEM PKCS #8, one block each: a
// file may hold the whole ring, in order.
func readKeys(file string) ([]ed25519.PrivateKey, error) {
	const want = `want PEM "PRIVATE KEY" (PKCS #8) blocks, as openssl genpkey -algorithm ed25519 writes`
	blocks, err := readPEM(file)
	if err != nil {
		return nil, err
	}
	if len(blocks) == 0 {
		return nil, fmt.Errorf("envelope: %s: no key: %s", file, want)
	}
	out := make([]ed25519.PrivateKey, len(blocks))
	for i, b := range blocks {
		if b.Type != "PRIVATE KEY" {
			return nil, fmt.Errorf("envelope: %s: block %d is a PEM %q: %s", file, i+1, b.Type, want)
		}
		key, err := x509.ParsePKCS8PrivateKey(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("envelope: %s: key %d: %w", file, i+1, err)
		}
		var ok bool
		if out[i], ok = key.(ed25519.PrivateKey); !ok {
			return nil, fmt.Errorf("envelope: %s: key %d: a %T key, want Ed25519", file, i+1, key)
		}
	}
	return out, nil
}

// readPrivateKey reads a PEM PKCS #8 private key, as the command how
// writes one.
func readPrivateKey(file, how string) (any, error) {
	der, err := readFirstPEM(file, "PRIVATE KEY", " (PKCS #8), as "+how+" writes")
	if err != nil {
		return nil, err
	}
	key, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("envelope: %s: %w", file, err)
	}
	return key, nil
}

// readFirstPEM returns the bytes of file's first PEM block, which must be
// of type typ; hint says where such a file comes from.
func readFirstPEM(file, typ, hint string) ([]byte, error) {
	blocks, err := readPEM(file)
	if err != nil {
		return nil, err
	}
	if len(blocks) == 0 || blocks[0].Type != typ {
		return nil, fmt.Errorf("envelope: %s: want a PEM %q%s", file, typ, hint)
	}
	return blocks[0].Bytes, nil
}

// readPEM returns file's PEM blocks.
func readPEM(file string) ([]*pem.Block, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("envelope: %w", err)
	}
	var out []*pem.Block
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			return out, nil
		}
		out = append(out, b)
	}
}

// Seal signs c as an envelope; c.Issuer is set, and c.ID if it is empty.
func (k *Keys) Seal(c *Claims) (string, error) {
	c.Issuer = Issuer
	if c.ID == "" {
		c.ID = NewID()
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("envelope: %w", err)
	}
	return k.sign(payload)
}

func (k *Keys) sign(payload []byte) (string, error) {
	return signCompact(k.signing().envelope, payload)
}

// signCompact signs payload with s, as a compact JWS.
func signCompact(s jose.Signer, payload []byte) (string, error) {
	jws, err := s.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("envelope: sign: %w", err)
	}
	return jws.CompactSerialize()
}

// Signer signs other payloads under the envelope keys, with a "typ" of
// their own, so that no verifier of envelopes takes them for one: the
// audit trail's checkpoints. Each is signed by the key that signs at the
// time.
func (k *Keys) Signer(typ string) (func(payload []byte) (string, error), error) {
	if _, err := k.signing().signer(typ); err != nil {
		return nil, err
	}
	return func(payload []byte) (string, error) {
		s, err := k.signing().signer(typ)
		if err != nil {
			return "", err
		}
		return signCompact(s, payload)
	}, nil
}

// NewID is an unguessable envelope id: 96 random bits.
func NewID() string {
	var b [idLen]byte
	return string(appendNewID(b[:0]))
}

// idLen is the length of an id: 96 bits in unpadded base64url.
const idLen = 16

// appendNewID appends a new id to dst.
func appendNewID(dst []byte) []byte {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return base64.RawURLEncoding.AppendEncode(dst, b[:])
}
