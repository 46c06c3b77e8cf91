package testbed

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The files a PKI writes into its directory, as envoy/mtls.yaml and
// envoy/jwt.yaml name them under /etc/envoy/tls/.
const (
	CAFile         = "ca.pem"
	ServerCertFile = "server.pem"
	ServerKeyFile  = "server-key.pem"
	// EnvoyClientCertFile and EnvoyClientKeyFile are the certificate
	// Envoy presents to capsnap (envoy/mtls.yaml's capsnap cluster): an
	// X.509-SVID for EnvoyIdentity.
	EnvoyClientCertFile = "envoy-client.pem"
	EnvoyClientKeyFile  = "envoy-client-key.pem"
	// CapsnapCertFile and CapsnapKeyFile are capsnap's own server
	// certificate on its gRPC listener (grpc_tls), for CapsnapServerName
	// and 127.0.0.1.
	CapsnapCertFile = "capsnap.pem"
	CapsnapKeyFile  = "capsnap-key.pem"
)

// EnvoyIdentity is the SPIFFE ID of Envoy's client certificate to capsnap,
// the identity capsnap's grpc_tls.allowed_clients names in envoy/mtls.yaml's
// deployment.
const EnvoyIdentity = "spiffe://acme/gateway/mcp-envoy"

// CapsnapServerName is the name capsnap's server certificate carries, which
// envoy/mtls.yaml sends as SNI and verifies.
const CapsnapServerName = "capsnap.capsnap.svc.cluster.local"

// PKI is a throwaway certificate authority for one test: a CA, Envoy's
// server certificate for 127.0.0.1 and localhost, Envoy's client
// certificate to capsnap, capsnap's server certificate, and client
// certificates (X.509-SVIDs) on demand.
type PKI struct {
	// Dir holds CAFile, and the key pair files named above.
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

	if err := ReplaceFile(filepath.Join(dir, CAFile), p.CAPEM()); err != nil {
		return nil, err
	}
	for _, kp := range []struct {
		cert, key string
		issue     func() (tls.Certificate, error)
	}{
		{ServerCertFile, ServerKeyFile, func() (tls.Certificate, error) { return p.ServerCert("localhost") }},
		{CapsnapCertFile, CapsnapKeyFile, func() (tls.Certificate, error) { return p.ServerCert(CapsnapServerName) }},
		{EnvoyClientCertFile, EnvoyClientKeyFile, func() (tls.Certificate, error) { return p.ClientCert(EnvoyIdentity) }},
	} {
		cert, err := kp.issue()
		if err != nil {
			return nil, err
		}
		if err := WriteKeyPair(dir, cert, kp.cert, kp.key); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// CAPEM is the CA's certificate, PEM-encoded.
func (p *PKI) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.ca.Raw})
}

// ServerCert issues a server certificate for the DNS name and 127.0.0.1.
func (p *PKI) ServerCert(name string) (tls.Certificate, error) {
	return p.Issue(func(c *x509.Certificate) {
		c.Subject = pkix.Name{CommonName: name}
		c.DNSNames = []string{name}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	})
}

// ClientCertDNS issues a client certificate whose only identity is the DNS
// SAN name.
func (p *PKI) ClientCertDNS(name string) (tls.Certificate, error) {
	return p.Issue(func(c *x509.Certificate) {
		c.DNSNames = []string{name}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
}

// WriteKeyPair writes cert's certificate and its key as PEM files named
// certFile and keyFile in dir, each replaced whole, as a rotation would.
func WriteKeyPair(dir string, cert tls.Certificate, certFile, keyFile string) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := ReplaceFile(filepath.Join(dir, certFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})); err != nil {
		return err
	}
	return ReplaceFile(filepath.Join(dir, keyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
}

// ReplaceFile replaces path with data whole (written aside, then renamed
// over it): a reader never sees half of it.
func ReplaceFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	return nil
}

// ClientCert issues a client certificate whose only identity is the URI
// SAN spiffeID, as an X.509-SVID has.
func (p *PKI) ClientCert(spiffeID string) (tls.Certificate, error) {
	id, err := url.Parse(spiffeID)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: SPIFFE ID %q: %w", spiffeID, err)
	}
	return p.Issue(func(c *x509.Certificate) {
		c.URIs = []*url.URL{id}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
}

// ClientTLS is the TLS configuration of a client that trusts this PKI's CA
// and presents certs (none for an anonymous client).
func (p *PKI) ClientTLS(certs ...tls.Certificate) *tls.Config {
	return &tls.Config{RootCAs: p.Pool, Certificates: certs, MinVersion: tls.VersionTLS12}
}

// Issue signs a fresh P-256 key's certificate, shaped by edit, with the CA:
// valid for an hour from a minute ago, with a random serial.
func (p *PKI) Issue(edit func(*x509.Certificate)) (tls.Certificate, error) {
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

// TLSRefusal makes a TLS handshake with the server at addr as cfg's client
// and returns the alert the server refused it with, or nil if the server
// accepted it (sent anything after the handshake: a gRPC server sends its
// HTTP/2 settings at once). Under TLS 1.3 the client's side of the
// handshake completes before the server has checked the client's
// certificate, so the refusal is the first thing read. Any other failure
// is returned as it is.
func TLSRefusal(addr string, cfg *tls.Config) error {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return err
	}
	_, err = conn.Read(make([]byte, 1))
	return err
}

// IsAlert reports whether err is a TLS alert the peer sent whose text
// contains want ("bad certificate", "certificate required", "unknown
// certificate authority").
func IsAlert(err error, want string) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error" && strings.Contains(err.Error(), want)
}
