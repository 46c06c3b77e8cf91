package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/capsnap/capsnap/mtls"
)

// GRPCTLS makes grpc_addr (ext_authz Check, ext_proc, grpc.health.v1)
// require TLS with a client certificate from client_ca_file whose identity
// is in AllowedClients. capsnap believes the principal a CheckRequest
// names, so whoever can call Check can claim any principal; this admits
// only the Envoys in front of the MCP servers. Unset (no cert_file), the
// listener is plaintext: keep it on loopback, or behind a mesh's mTLS.
type GRPCTLS struct {
	// CertFile and KeyFile are capsnap's server certificate chain and
	// private key, PEM.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile is the PEM bundle a client certificate must chain to.
	ClientCAFile string `yaml:"client_ca_file"`
	// AllowedClients are the identities admitted: "spiffe://..." (an
	// X.509-SVID's URI SAN, exactly) or "dns:NAME" (one of the
	// certificate's DNS SANs, exactly).
	AllowedClients []string `yaml:"allowed_clients"`
	// ReloadInterval is how often the three files are checked; new
	// content that loads is in force for the next handshake, content that
	// does not is logged and ignored.
	ReloadInterval time.Duration `yaml:"reload_interval"`
	// MaxConnectionAge ends each client connection (gracefully: a GOAWAY,
	// then in-flight calls finish) after this long, so that every client
	// handshakes again against the material in force: a CA withdrawn from
	// the bundle, or a new server certificate, reaches every connection
	// within it.
	MaxConnectionAge time.Duration `yaml:"max_connection_age"`
}

// Enabled reports whether any of the section is set; then all of it must be.
func (t GRPCTLS) Enabled() bool {
	return t.CertFile != "" || t.KeyFile != "" || t.ClientCAFile != "" || len(t.AllowedClients) > 0
}

// Admin protects the admin listener's endpoints that change state (POST
// /policy/reload) or expose memory (/debug/pprof/). GET /healthz, /readyz,
// /metrics and /catalog stay open, for the kubelet and Prometheus.
type Admin struct {
	// TokenFile holds a bearer token (at least MinTokenBytes) those
	// endpoints require in "Authorization: Bearer ...". It is read at each
	// such request, so replacing the file rotates it. Required unless
	// admin_addr is a loopback address.
	TokenFile string `yaml:"token_file"`
}

// MinTokenBytes is the least an admin.token_file may hold.
const MinTokenBytes = 32

// ReadToken reads the admin token file: its bytes, less a final newline.
// The token is sent in a header, so it is printable ASCII without spaces
// (base64 is).
func (a Admin) ReadToken() ([]byte, error) {
	b, err := readSecretFile("admin.token_file", a.TokenFile, MinTokenBytes)
	if err != nil {
		return nil, err
	}
	for _, c := range b {
		if c <= ' ' || c > '~' {
			return nil, fmt.Errorf("admin.token_file: %s holds a byte that cannot go in a header: want printable ASCII without spaces, such as base64", a.TokenFile)
		}
	}
	return b, nil
}

// readSecretFile reads the secret in the file at path, which field names:
// its bytes, less a final newline, and at least minBytes of them.
func readSecretFile(field, path string, minBytes int) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
	if len(b) < minBytes {
		return nil, fmt.Errorf("%s: %s holds %d bytes, fewer than %d (make one with: head -c 32 /dev/urandom | base64 > %s)", field, path, len(b), minBytes, filepath.Base(path))
	}
	return b, nil
}

// Loopback reports whether addr's host is a loopback address (or
// "localhost"): reachable only from this host, or this pod.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (c *Config) resolveAccessPaths(abs func(string) string) {
	t := &c.GRPCTLS
	t.CertFile, t.KeyFile, t.ClientCAFile = abs(t.CertFile), abs(t.KeyFile), abs(t.ClientCAFile)
	c.Admin.TokenFile = abs(c.Admin.TokenFile)
}

// validateAccess checks grpc_tls and admin, naming the field.
func (c Config) validateAccess() error {
	if err := c.GRPCTLS.validate(); err != nil {
		return fmt.Errorf("grpc_tls.%w", err)
	}
	if c.Admin.TokenFile == "" && !Loopback(c.AdminAddr) {
		return fmt.Errorf("admin.token_file: required, since admin_addr %s is not a loopback address: POST /policy/reload would be open to whoever can reach it", c.AdminAddr)
	}
	return nil
}

func (t GRPCTLS) validate() error {
	switch {
	case !t.Enabled():
		return nil
	case t.CertFile == "":
		return errors.New("cert_file: required with grpc_tls")
	case t.KeyFile == "":
		return errors.New("key_file: required with grpc_tls")
	case t.ClientCAFile == "":
		return errors.New("client_ca_file: required with grpc_tls: client certificates are verified against it")
	case len(t.AllowedClients) == 0:
		return errors.New("allowed_clients: at least one is required: a CA alone admits every workload it ever issued a certificate for")
	case t.ReloadInterval < 100*time.Millisecond || t.ReloadInterval > time.Hour:
		return fmt.Errorf("reload_interval: %s is outside 100ms..1h", t.ReloadInterval)
	case t.MaxConnectionAge < time.Second || t.MaxConnectionAge > 24*time.Hour:
		return fmt.Errorf("max_connection_age: %s is outside 1s..24h", t.MaxConnectionAge)
	}
	seen := map[string]bool{}
	for i, id := range t.AllowedClients {
		parsed, err := mtls.ParseIdentity(id)
		if err != nil {
			return fmt.Errorf("allowed_clients[%d]: %w", i, err)
		}
		if seen[parsed.String()] {
			return fmt.Errorf("allowed_clients[%d]: %q is listed twice", i, id)
		}
		seen[parsed.String()] = true
	}
	return nil
}
