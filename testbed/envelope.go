package testbed

import (
	"crypto/ed25519"
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

// EnvelopeKey is the path of the envelope key the stack wrote with
// StackOptions.Envelope.
func (s *Stack) EnvelopeKey() string { return filepath.Join(s.opts.Dir, "envelope-1.pem") }

// SetEnvelopeKeys rewrites capsnap's envelope.key_files, for its next
// start (StartCapsnap): a key rotation.
func (s *Stack) SetEnvelopeKeys(files ...string) error {
	s.envelopeKeys = files
	return s.writeCapsnapConfigs()
}
