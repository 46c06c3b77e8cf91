// Package mtls is the TLS side of a server that admits only the clients it
// knows: capsnap's gRPC listener, which must take Checks from the Envoys in
// front of MCP servers and from no one else, since a CheckRequest names its
// own principal.
//
// A client must present a certificate that chains to the client CA bundle
// and whose identity is on an allowlist: an exact SPIFFE ID (the
// certificate's one URI SAN) or an exact DNS name (one of its DNS SANs).
// Anything else is refused in the TLS handshake, before a single gRPC byte
// is read. The server's certificate, its key and the CA bundle are files;
// Run polls them and puts new content in force for the next handshake,
// without a restart. New content that does not load (a half-written file, a
// key that does not match its certificate, an expired certificate, a bundle
// with no certificate) is logged and ignored: the last good material stays
// in force until the files are good again.
package mtls

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// Options say where the material is and whom to admit.
type Options struct {
	// CertFile and KeyFile are the server's certificate chain and its
	// private key, PEM.
	CertFile, KeyFile string
	// ClientCAFile is the PEM bundle of CA certificates a client's
	// certificate must chain to. During a CA rotation it holds both.
	ClientCAFile string
	// Allowed are the identities admitted, each as ParseIdentity reads it.
	// At least one: a CA alone admits every workload it ever issued for.
	Allowed []string
	// ReloadInterval is how often Run checks the files for new content.
	ReloadInterval time.Duration
	// Logger hears reloads, refused reloads and refused clients.
	Logger zerolog.Logger
}

// An Identity is one allowlist entry.
type Identity struct {
	// SPIFFE is an exact SPIFFE ID, matched against a certificate's URI SAN.
	SPIFFE string
	// DNS is an exact DNS name, matched against a certificate's DNS SANs.
	DNS string
}

func (id Identity) String() string {
	if id.SPIFFE != "" {
		return id.SPIFFE
	}
	return dnsPrefix + id.DNS
}

const dnsPrefix = "dns:"

var (
	// A SPIFFE ID's trust domain and path segments, as the SPIFFE ID
	// specification allows them: lower-case trust domains, no empty, "."
	// or ".." segments, no percent-encoding, query, fragment, port or user.
	trustDomainPattern = regexp.MustCompile(`^[a-z0-9._-]+$`)
	segmentPattern     = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	// A DNS name of letters, digits and hyphens, in dot-separated labels:
	// no wildcard, no trailing dot.
	dnsPattern = regexp.MustCompile(`^(?i)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)
)

// ParseIdentity reads an allowlist entry: "spiffe://trust-domain/path",
// matched exactly against a certificate's URI SAN, or "dns:name", matched
// exactly (ignoring letter case) against its DNS SANs. No wildcards, no
// prefixes: each entry names one workload.
func ParseIdentity(s string) (Identity, error) {
	if name, ok := strings.CutPrefix(s, dnsPrefix); ok {
		if len(name) > 253 || !dnsPattern.MatchString(name) {
			return Identity{}, fmt.Errorf("%q: %q is not a DNS name (exact; no wildcard, no trailing dot)", s, name)
		}
		return Identity{DNS: strings.ToLower(name)}, nil
	}
	if !strings.HasPrefix(s, "spiffe://") {
		return Identity{}, fmt.Errorf("%q is neither spiffe://TRUST-DOMAIN/PATH nor dns:NAME", s)
	}
	u, err := url.Parse(s)
	if err != nil {
		return Identity{}, fmt.Errorf("%q: %w", s, err)
	}
	if u.User != nil || u.Port() != "" || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery ||
		!trustDomainPattern.MatchString(u.Host) || u.String() != s {
		return Identity{}, fmt.Errorf("%q is not a SPIFFE ID: a lower-case trust domain and a path, nothing else", s)
	}
	if u.Path == "" || u.Path == "/" {
		return Identity{}, fmt.Errorf("%q names a trust domain, not a workload: add its path", s)
	}
	for _, seg := range strings.Split(strings.TrimPrefix(u.Path, "/"), "/") {
		if seg == "." || seg == ".." || !segmentPattern.MatchString(seg) {
			return Identity{}, fmt.Errorf("%q is not a SPIFFE ID: path segment %q", s, seg)
		}
	}
	return Identity{SPIFFE: s}, nil
}

// allowlist is the parsed Options.Allowed.
type allowlist struct {
	spiffe map[string]bool
	dns    map[string]bool
}

func parseAllowlist(entries []string) (allowlist, error) {
	a := allowlist{spiffe: map[string]bool{}, dns: map[string]bool{}}
	if len(entries) == 0 {
		return a, errors.New("mtls: no allowed clients: a CA alone admits every workload it ever issued a certificate for")
	}
	for i, e := range entries {
		id, err := ParseIdentity(e)
		if err != nil {
			return a, fmt.Errorf("mtls: allowed[%d]: %w", i, err)
		}
		if id.SPIFFE != "" {
			a.spiffe[id.SPIFFE] = true
		} else {
			a.dns[id.DNS] = true
		}
	}
	return a, nil
}

// match returns the identity of leaf the allowlist admits it by, or "".
// An X.509-SVID has exactly one URI SAN; a certificate with more is no
// SVID, and none of its URIs is matched.
func (a allowlist) match(leaf *x509.Certificate) string {
	if len(leaf.URIs) == 1 {
		if id := leaf.URIs[0].String(); a.spiffe[id] {
			return id
		}
	}
	for _, name := range leaf.DNSNames {
		if a.dns[strings.ToLower(name)] {
			return dnsPrefix + strings.ToLower(name)
		}
	}
	return ""
}

// describe names a refused certificate in the log: its SANs, or its
// subject if it has none.
func describe(leaf *x509.Certificate) string {
	var names []string
	for _, u := range leaf.URIs {
		names = append(names, u.String())
	}
	for _, d := range leaf.DNSNames {
		names = append(names, dnsPrefix+d)
	}
	if len(names) == 0 {
		return "subject " + leaf.Subject.String()
	}
	return strings.Join(names, ", ")
}

// Server holds the material in force and hands each handshake a TLS
// configuration built from it.
type Server struct {
	opts    Options
	allowed allowlist
	log     zerolog.Logger
	// refusals logs refused clients, a few a second at most: anyone who
	// can reach the port can make one.
	refusals zerolog.Logger
	cur      atomic.Pointer[material]

	mu sync.Mutex // serializes Reload
	// failed is the digest of the last content that did not load, or of
	// the read error, so that it is logged once, not every interval.
	failed [sha256.Size]byte
}

// material is one generation of certificate, key and CA bundle.
type material struct {
	digest [sha256.Size]byte
	config *tls.Config
	leaf   *x509.Certificate
	cas    int
}

// New loads the material, which must be good, and parses the allowlist.
func New(o Options) (*Server, error) {
	a, err := parseAllowlist(o.Allowed)
	if err != nil {
		return nil, err
	}
	if o.ReloadInterval <= 0 {
		return nil, errors.New("mtls: reload interval must be positive")
	}
	s := &Server{opts: o, allowed: a, log: o.Logger.With().Str("component", "mtls").Logger()}
	s.refusals = s.log.Sample(&zerolog.BurstSampler{Burst: 5, Period: time.Second})
	raw, err := s.read()
	if err != nil {
		return nil, err
	}
	m, err := s.build(raw)
	if err != nil {
		return nil, err
	}
	s.cur.Store(m)
	return s, nil
}

// TLSConfig is the server's TLS configuration: each handshake gets the
// material in force at its start.
func (s *Server) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.cur.Load().config, nil
		},
	}
}

// Run checks the files every ReloadInterval until ctx ends.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(s.opts.ReloadInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_, _ = s.Reload()
		}
	}
}

// Reload reads the files and, if their content changed and loads, puts it
// in force for the next handshake. It reports whether it did; on an error
// the material in force stays.
func (s *Server) Reload() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	raw, err := s.read()
	if err != nil {
		s.refuse(sha256.Sum256([]byte(err.Error())), err)
		return false, err
	}
	d := digest(raw)
	if d == s.cur.Load().digest {
		s.failed = [sha256.Size]byte{}
		return false, nil
	}
	m, err := s.build(raw)
	if err != nil {
		s.refuse(d, err)
		return false, err
	}
	s.failed = [sha256.Size]byte{}
	s.cur.Store(m)
	s.log.Info().Str("cert_file", s.opts.CertFile).Str("serial", m.leaf.SerialNumber.Text(16)).
		Time("not_after", m.leaf.NotAfter).Int("client_cas", m.cas).
		Msg("TLS certificate, key or client CA bundle changed on disk: in force for new connections")
	return true, nil
}

// refuse logs a reload that failed, once per failing content.
func (s *Server) refuse(d [sha256.Size]byte, err error) {
	if d == s.failed {
		return
	}
	s.failed = d
	cur := s.cur.Load()
	s.log.Error().Err(err).Str("serial_in_force", cur.leaf.SerialNumber.Text(16)).Time("not_after_in_force", cur.leaf.NotAfter).
		Msg("TLS material on disk does not load; keeping the material in force")
}

// Current reports the serial number and expiry of the server certificate in
// force.
func (s *Server) Current() (serial string, notAfter time.Time) {
	m := s.cur.Load()
	return m.leaf.SerialNumber.Text(16), m.leaf.NotAfter
}

type files struct{ cert, key, ca []byte }

func (s *Server) read() (files, error) {
	var f files
	for _, r := range []struct {
		path string
		to   *[]byte
	}{{s.opts.CertFile, &f.cert}, {s.opts.KeyFile, &f.key}, {s.opts.ClientCAFile, &f.ca}} {
		b, err := os.ReadFile(r.path)
		if err != nil {
			return f, fmt.Errorf("mtls: %w", err)
		}
		*r.to = b
	}
	return f, nil
}

func digest(f files) [sha256.Size]byte {
	h := sha256.New()
	for _, b := range [][]byte{f.cert, f.key, f.ca} {
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

// build checks one generation of material and makes its TLS configuration.
func (s *Server) build(f files) (*material, error) {
	pair, err := tls.X509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, fmt.Errorf("mtls: %s and %s: %w", s.opts.CertFile, s.opts.KeyFile, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("mtls: %s: %w", s.opts.CertFile, err)
	}
	if now := time.Now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return nil, fmt.Errorf("mtls: %s: the certificate is valid from %s to %s, not now", s.opts.CertFile, leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339))
	}
	pool, n, err := parseBundle(f.ca)
	if err != nil {
		return nil, fmt.Errorf("mtls: %s: %w", s.opts.ClientCAFile, err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		// A resumed session would skip the chain check against the CA
		// bundle in force; the clients keep long-lived HTTP/2
		// connections, so a full handshake each time costs nothing.
		SessionTicketsDisabled: true,
		VerifyConnection:       s.verify,
	}
	return &material{digest: digest(f), config: cfg, leaf: leaf, cas: n}, nil
}

// verify admits a handshake whose verified client certificate is on the
// allowlist. It runs after the chain was verified against the bundle.
func (s *Server) verify(cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 || len(cs.PeerCertificates) == 0 {
		return errors.New("mtls: no verified client certificate")
	}
	leaf := cs.PeerCertificates[0]
	if s.allowed.match(leaf) != "" {
		return nil
	}
	client := describe(leaf)
	s.refusals.Warn().Str("client", client).Str("issuer", leaf.Issuer.String()).
		Msg("TLS client refused: its certificate is valid but its identity is not in allowed_clients")
	return fmt.Errorf("mtls: client %s is not allowed", client)
}

// parseBundle reads every CERTIFICATE block of a PEM bundle. Text between
// blocks (a bundle's comments) is skipped; another kind of block (a key in
// the wrong file), a certificate that does not parse, or no certificate at
// all is an error.
func parseBundle(b []byte) (*x509.CertPool, int, error) {
	pool := x509.NewCertPool()
	n := 0
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, 0, fmt.Errorf("a %s block in a CA bundle", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, 0, err
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, 0, errors.New("no PEM certificate")
	}
	return pool, n, nil
}

// Identities returns the allowlist, sorted, as ParseIdentity wrote it.
func (s *Server) Identities() []string {
	var out []string
	for id := range s.allowed.spiffe {
		out = append(out, id)
	}
	for name := range s.allowed.dns {
		out = append(out, dnsPrefix+name)
	}
	slices.Sort(out)
	return out
}
