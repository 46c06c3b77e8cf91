package testbed

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
)

// WriteEnvelopeKey writes a new Ed25519 private key, PEM PKCS #8, as
// capsnap's envelope.key_files reads it.
func WriteEnvelopeKey(path string) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("envelope key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return fmt.Errorf("envelope key: %w", err)
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

// WriteGrantKey writes a new P-256 grant key: the private half, PEM PKCS
// #8, at path, as a verifier's grant key files read it, and the public
// half at path+".pub", as capsnap's servers[].grant_key_file reads it.
func WriteGrantKey(path string) error {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("grant key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return fmt.Errorf("grant key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(priv.Public())
	if err != nil {
		return fmt.Errorf("grant key: %w", err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(path+".pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

// GrantKeyFile is where a stack in dir keeps server id's grant key, with
// StackOptions.Grants; its public half is that path and ".pub".
func GrantKeyFile(dir, id string) string { return filepath.Join(dir, "grant-"+id+".pem") }

// EnvelopeKey is the path of the envelope key the stack wrote with
// StackOptions.Envelope.
func (s *Stack) EnvelopeKey() string { return filepath.Join(s.opts.Dir, "envelope-1.pem") }

// SetEnvelopeKeys rewrites capsnap's envelope.key_files, for its next
// start (StartCapsnap): a key rotation.
func (s *Stack) SetEnvelopeKeys(files ...string) error {
	s.envelopeKeys = files
	return s.writeCapsnapConfigs()
}
