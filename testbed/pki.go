package testbed

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// The files a PKI writes into its directory, as envoy/mtls.yaml and
// envoy/jwt.yaml name them under /etc/envoy/tls/.
const (
	CAFile         = "ca.pem"
	ServerCertFile = "server.pem"
	ServerKeyFile  = "server-key.pem"
)

// PKI is a throwaway certificate authority for one test: a CA, Envoy's
// server certificate for 127.0.0.1 and localhost, and client certificates
// (X.509-SVIDs) on demand.
type PKI struct {
	// Dir holds CAFile, ServerCertFile and ServerKeyFile.
	Dir string
	// Pool trusts the CA, for clients that verify Envoy.
	Pool *x509.CertPool

	ca  *x509.Certificate
	key *ecdsa.PrivateKey
}

// pkiValidity is how long every certificate is valid: longer than any test.
const pkiValidity = time.Hour

// NewPKI creates a CA and a server certificate signed by it, and writes
// them to dir.
func NewPKI(dir string) (*PKI, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	tmpl, err := certTemplate()
	if err != nil {
		return nil, err
	}
	tmpl.Subject = pkix.Name{CommonName: "capsnap test CA"}
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("pki: CA: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: CA: %w", err)
	}
	p := &PKI{Dir: dir, Pool: x509.NewCertPool(), ca: ca, key: key}
	p.Pool.AddCert(ca)

	server, err := p.issue(func(c *x509.Certificate) {
		c.Subject = pkix.Name{CommonName: "localhost"}
		c.DNSNames = []string{"localhost"}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	})
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(server.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	for name, block := range map[string]*pem.Block{
		CAFile:         {Type: "CERTIFICATE", Bytes: ca.Raw},
		ServerCertFile: {Type: "CERTIFICATE", Bytes: server.Certificate[0]},
		ServerKeyFile:  {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			return nil, fmt.Errorf("pki: %w", err)
		}
	}
	return p, nil
}

// ClientCert issues a client certificate whose only identity is the URI
// SAN spiffeID, as an X.509-SVID has.
func (p *PKI) ClientCert(spiffeID string) (tls.Certificate, error) {
	id, err := url.Parse(spiffeID)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: SPIFFE ID %q: %w", spiffeID, err)
	}
	return p.issue(func(c *x509.Certificate) {
		c.URIs = []*url.URL{id}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
}

// ClientTLS is the TLS configuration of a client that trusts this PKI's CA
// and presents certs (none for an anonymous client).
func (p *PKI) ClientTLS(certs ...tls.Certificate) *tls.Config {
	return &tls.Config{RootCAs: p.Pool, Certificates: certs, MinVersion: tls.VersionTLS12}
}

// issue signs a fresh P-256 key's certificate, shaped by edit, with the CA.
func (p *PKI) issue(edit func(*x509.Certificate)) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: %w", err)
	}
	tmpl, err := certTemplate()
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	edit(tmpl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, key.Public(), p.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: issue: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func certTemplate() (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("pki: serial: %w", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		// A minute back, so a clock a little behind still accepts it.
		NotBefore: now.Add(-time.Minute),
		NotAfter:  now.Add(pkiValidity),
	}, nil
}
