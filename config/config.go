// Package config is capsnap's configuration file: what it listens on, which
// MCP servers it guards, where the principal comes from and which policy
// applies. Decoding is strict and Validate names the field that is wrong, so
// a typo stops the binary at start instead of silently weakening a check.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Principal sources.
const (
	// SourceMTLS takes the principal from the downstream peer certificate
	// as Envoy reports it (attributes.source.principal): a SPIFFE ID.
	SourceMTLS = "mtls"
	// SourceJWT takes it from a claim of a token Envoy's jwt_authn filter
	// verified and wrote to dynamic metadata.
	SourceJWT = "jwt"
	// SourceHeader takes it from a request header. Anyone can send a
	// header, so this is for development only and must be unlocked with
	// insecure_header: true.
	SourceHeader = "header"
)

// Config is the whole configuration file.
type Config struct {
	// GRPCAddr is where the Envoy ext_authz and grpc.health.v1 services listen.
	GRPCAddr string `yaml:"grpc_addr"`
	// AdminAddr serves /healthz, /readyz and /metrics over HTTP.
	AdminAddr string `yaml:"admin_addr"`
	// GRPCTLS, when set, admits only allowlisted client certificates to
	// grpc_addr; Admin guards admin_addr's state-changing endpoints.
	GRPCTLS GRPCTLS `yaml:"grpc_tls"`
	Admin   Admin   `yaml:"admin"`
	// PolicyFile is the policy that classifies tools and grants them.
	PolicyFile string `yaml:"policy_file"`
	// PolicyPoll is how often the policy file (and its lockfile) is
	// checked for changes; a change reloads it, never loosening.
	PolicyPoll time.Duration `yaml:"policy_poll_interval"`
	// Drain is how long capsnap reports NOT_SERVING on grpc.health.v1
	// after SIGTERM before it stops taking Checks: long enough for Envoy's
	// active health check to route to the other replicas first. Zero
	// stops at once.
	Drain time.Duration `yaml:"drain"`
	// Denials configures what a denial tells the caller.
	Denials Denials `yaml:"denials"`
	// Principal says where the acting identity comes from.
	Principal Principal `yaml:"principal"`
	// Servers are the upstream MCP servers, by the server_id that Envoy's
	// route puts in context_extensions.
	Servers []Server `yaml:"servers"`
	// Snapshots configures the capability snapshots minted at tools/list.
	Snapshots Snapshots `yaml:"snapshots"`
	// Discovery says what a snapshot binds: the tools/list response the
	// agent was delivered, or capsnap's own view of the catalog.
	Discovery Discovery `yaml:"discovery"`
	// Catalog says when a server's catalog is too old to verify against.
	Catalog Catalog `yaml:"catalog"`
	// Limits bound what a request body may be.
	Limits Limits `yaml:"limits"`
	// Log configures the operational log (stderr).
	Log Log `yaml:"log"`
	// Audit says where the audit trail (one JSON line per decision) goes.
	Audit Audit `yaml:"audit"`
	// Debug turns on diagnostics that are off in production.
	Debug Debug `yaml:"debug"`
	// Envelope configures the signed envelope of allowed calls.
	Envelope Envelope `yaml:"envelope"`
}

// Envelope configures the signed envelope capsnap sends the MCP server on
// every allowed tools/call (docs/ENVELOPE.md).
type Envelope struct {
	// KeyFiles are Ed25519 private keys (PEM PKCS #8): the first signs,
	// all are published in the JWKS. None: no envelope is sent.
	KeyFiles []string `yaml:"key_files"`
	// TTL is how long an envelope is valid, never past its snapshot.
	TTL time.Duration `yaml:"ttl"`
}

// MaxEnvelopeTTL is the ceiling on envelope.ttl: an envelope is for one
// call, about to be made.
const MaxEnvelopeTTL = time.Minute

// Debug configures diagnostics.
type Debug struct {
	// Pprof serves net/http/pprof under /debug/pprof/ on the admin
	// listener. Off by default: a profile shows the heap, and so request
	// bodies and principals, to whoever can reach admin_addr.
	Pprof bool `yaml:"pprof"`
}

// Audit configures the audit trail.
type Audit struct {
	// Path is a file to append to; empty means stdout.
	Path string `yaml:"path"`
	// CheckpointInterval bounds how long a line waits for a signed
	// checkpoint of the chain that covers it, and so how young the lines
	// are that could be cut from the end of a live trail unseen. 0 means
	// 10s.
	CheckpointInterval time.Duration `yaml:"checkpoint_interval"`
}

// MaxCheckpointInterval is the ceiling on audit.checkpoint_interval.
const MaxCheckpointInterval = 10 * time.Minute

// Principal configures identity.
type Principal struct {
	Source string `yaml:"source"`
	// JWT applies when Source is "jwt".
	JWT JWT `yaml:"jwt"`
	// Header is the request header read when Source is "header".
	Header string `yaml:"header"`
	// InsecureHeader must be true for Source "header": a deliberate,
	// logged opt-in to trusting a client-supplied identity.
	InsecureHeader bool `yaml:"insecure_header"`
}

// JWT locates a verified claim in Envoy's dynamic metadata.
type JWT struct {
	// MetadataNamespace is the filter namespace jwt_authn writes into.
	MetadataNamespace string `yaml:"metadata_namespace"`
	// PayloadKey is the jwt_authn provider's payload_in_metadata.
	PayloadKey string `yaml:"payload_key"`
	// Claim is the claim that names the principal.
	Claim string `yaml:"claim"`
}

// Server is one upstream MCP server. Exactly one of URL and CatalogFile.
type Server struct {
	ID string `yaml:"id"`
	// URL is the server's streamable HTTP endpoint; capsnap connects to it
	// directly (not through Envoy) as an MCP client to keep its own view.
	URL string `yaml:"url"`
	// CatalogFile is a static tools/list result to use instead of a URL.
	CatalogFile string `yaml:"catalog_file"`
	// ProtocolVersion is the MCP version capsnap speaks to the server.
	ProtocolVersion string `yaml:"protocol_version"`
	// Resync is the backstop interval for relisting even without a
	// list_changed notification.
	Resync time.Duration `yaml:"resync_interval"`
	// ClientCapabilities are the client capabilities capsnap's own MCP
	// session declares at initialize. Servers may offer a tool only to
	// sessions that declare one; declaring them all lets capsnap see the
	// widest catalog, so that it can confirm any tool an agent is
	// delivered. Nil means all of ClientCapabilityNames.
	ClientCapabilities []string `yaml:"client_capabilities"`
	// GrantKeyFile is the public half of the server's grant key (P-256,
	// PEM "PUBLIC KEY"). With it, capsnap signs a grant once per snapshot
	// and tool and binds each call with a MAC under the grant's call key,
	// which only this server can decrypt; without it, each call's envelope
	// is signed whole (docs/ENVELOPE.md).
	GrantKeyFile string `yaml:"grant_key_file"`
}

// ClientCapabilityNames are the client capabilities capsnap can declare.
var ClientCapabilityNames = []string{"elicitation", "roots", "sampling"}

// Discovery modes.
const (
	// BindDelivered mints a snapshot from the tools/list response itself,
	// which Envoy's ext_proc filter sends capsnap: it pins exactly the
	// tools the agent is delivered that capsnap's live view confirms, and
	// rewrites the response to exactly those.
	BindDelivered = "delivered"
	// BindCatalog mints a snapshot at the tools/list request, from
	// capsnap's own view of the catalog: for an Envoy with ext_authz only.
	// It is the weaker mode: the agent is delivered whatever the server
	// sends, which may differ from what was pinned.
	BindCatalog = "catalog"
)

// Discovery configures the authorize boundary.
type Discovery struct {
	// Bind is BindDelivered or BindCatalog.
	Bind string `yaml:"bind"`
	// MaxResponseBytes bounds a tools/list response capsnap reads on the
	// response path; a larger one never reaches the agent. Streamed in
	// full duplex, capsnap stops reading past it. Buffered, Envoy holds
	// such a response up to the ext_authz filter's max_request_bytes
	// (which bounds both directions of the request) and refuses a larger
	// one itself: keep the two equal.
	MaxResponseBytes int `yaml:"max_response_bytes"`
}

// Denials configures what a denial tells the caller.
type Denials struct {
	// ListAllowedTools makes a denial that sends the caller back to
	// planning list the tools its snapshot lets it call.
	ListAllowedTools bool `yaml:"list_allowed_tools"`
	// Status is the HTTP status of a denial: StatusOK or StatusHTTPError.
	Status string `yaml:"status"`
	// CallForm is the form of a tools/call denial: CallFormError or
	// CallFormToolResult.
	CallForm string `yaml:"call_form"`
}

// Denial statuses and forms. Every official MCP SDK client (Go, TypeScript,
// Python) surfaces a JSON-RPC error with its code and data only when it
// comes with a 2xx: the TypeScript client turns any other status into a
// transport error that carries the body as text.
const (
	// StatusOK answers a denial with HTTP 200 and the JSON-RPC error for
	// the request's id.
	StatusOK = "ok"
	// StatusHTTPError answers it with 403 (400 for a malformed request or
	// a header mismatch, 415 for an unsupported body), for HTTP-level
	// tooling that counts 4xx; TypeScript agents then get the reason only
	// as text.
	StatusHTTPError = "http_error"
	// CallFormError denies a tools/call with a JSON-RPC error.
	CallFormError = "error"
	// CallFormToolResult denies it with a tool result (isError: true) whose
	// text says why and what to do next, for hosts that hand tool errors
	// to the model rather than to the agent's code.
	CallFormToolResult = "tool_result"
)

// Snapshots configures capability snapshots.
type Snapshots struct {
	// TTL is how long a snapshot is valid after it is minted: short, so a
	// snapshot is never a standing grant.
	TTL time.Duration `yaml:"ttl"`
	// MaxSnapshots bounds memory: the least recently used go first. With
	// the redis store it bounds the snapshots each replica keeps a copy
	// of; Redis holds every one until it expires.
	MaxSnapshots int64 `yaml:"max_snapshots"`
	// Store is where snapshots live: StoreMemory (this process only) or
	// StoreRedis (shared by every replica).
	Store string `yaml:"store"`
	// Redis configures StoreRedis.
	Redis Redis `yaml:"redis"`
}

// The snapshot stores.
const (
	StoreMemory = "memory"
	StoreRedis  = "redis"
)

// Redis is the shared snapshot store of several replicas.
type Redis struct {
	// Addr is host:port of a Redis (or Valkey) 6 or later: the store
	// relies on RESP3 client-side caching.
	Addr     string `yaml:"addr"`
	Username string `yaml:"username"`
	// PasswordFile holds the password (ACL or requirepass), if any.
	PasswordFile string `yaml:"password_file"`
	DB           int    `yaml:"db"`
	// KeyPrefix starts every key capsnap writes.
	KeyPrefix string `yaml:"key_prefix"`
	// SecretFile holds the key (at least 32 bytes) that authenticates
	// every record; every replica sharing the store has the same. It also
	// authenticates the tickets a tools/list hands its response, which
	// may reach another replica.
	SecretFile string `yaml:"secret_file"`
	// TLS, when CAFile is set, connects to Redis over TLS verified
	// against it, with a client certificate if CertFile and KeyFile are.
	TLS RedisTLS `yaml:"tls"`
	// Timeout bounds each operation: a Redis slower than this is
	// unavailable, and every tools/list and tools/call is denied
	// store_unavailable until it answers in time again.
	Timeout time.Duration `yaml:"timeout"`
	// ProbeInterval is how often capsnap checks Redis: how long it takes
	// at most to see it gone, or back.
	ProbeInterval time.Duration `yaml:"probe_interval"`
}

// RedisTLS configures TLS to Redis.
type RedisTLS struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

// MinSecretBytes is the least a snapshots.redis.secret_file may hold.
const MinSecretBytes = 32

// ReadSecret reads the secret file: its bytes, less a final newline.
func (r Redis) ReadSecret() ([]byte, error) {
	return readSecretFile("snapshots.redis.secret_file", r.SecretFile, MinSecretBytes)
}

// ReadPassword reads the password file, if one is configured.
func (r Redis) ReadPassword() (string, error) {
	if r.PasswordFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(r.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("snapshots.redis.password_file: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// MaxSnapshotTTL is the ceiling on snapshots.ttl.
const MaxSnapshotTTL = time.Hour

// Catalog bounds how stale a server's catalog may be.
type Catalog struct {
	// MaxAge is how long after its last confirmed tools/list a server's
	// catalog still counts as live. A catalog that is older, never synced,
	// or whose connection is failing denies tools/call
	// (catalog_unavailable).
	MaxAge time.Duration `yaml:"max_age"`
	// AllowStaleReads lets a call to a tool pinned as effect class "read"
	// pass on its snapshot alone while the catalog is unavailable. Off by
	// default; every such decision is audited.
	AllowStaleReads bool `yaml:"allow_stale_reads"`
}

// Limits bound request bodies.
type Limits struct {
	MaxBodyBytes int `yaml:"max_body_bytes"`
	MaxDepth     int `yaml:"max_depth"`
}

// Log configures the operational log.
type Log struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// Default returns the configuration capsnap uses for every field a file
// leaves out. Its addresses are the ones the demo's Envoy YAML points at.
func Default() Config {
	return Config{
		GRPCAddr:  "127.0.0.1:9001",
		AdminAddr: "127.0.0.1:9002",
		GRPCTLS:   GRPCTLS{ReloadInterval: 10 * time.Second, MaxConnectionAge: 10 * time.Minute},
		Principal: Principal{
			Source: SourceMTLS,
			JWT:    JWT{MetadataNamespace: "envoy.filters.http.jwt_authn", PayloadKey: "jwt_payload", Claim: "sub"},
			Header: "x-capsnap-dev-principal",
		},
		PolicyPoll: 2 * time.Second,
		Denials:    Denials{ListAllowedTools: true, Status: StatusOK, CallForm: CallFormError},
		Snapshots: Snapshots{TTL: 5 * time.Minute, MaxSnapshots: 100_000, Store: StoreMemory,
			Redis: Redis{KeyPrefix: "capsnap:", Timeout: 200 * time.Millisecond, ProbeInterval: 500 * time.Millisecond}},
		Discovery: Discovery{Bind: BindDelivered, MaxResponseBytes: 1 << 20},
		Envelope:  Envelope{TTL: 30 * time.Second},
		Catalog:   Catalog{MaxAge: 2 * time.Minute},
		Limits:    Limits{MaxBodyBytes: 1 << 20, MaxDepth: 64},
		Log:       Log{Level: "info", Format: "json"},
	}
}

const (
	defaultResync   = 30 * time.Second
	defaultProtocol = "2025-11-25"
)

// Load reads, decodes and validates a configuration file. Relative paths in
// it are taken relative to the file's directory.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return Config{}, fmt.Errorf("load config %s: %w", path, err)
	}
	c.resolvePaths(filepath.Dir(path))
	return c, nil
}

// Parse decodes a configuration over the defaults, rejecting unknown keys,
// and validates it.
func Parse(data []byte) (Config, error) {
	c := Default()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("decode: %w", err)
	}
	if err := dec.Decode(new(any)); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("decode: more than one YAML document")
	}
	for i := range c.Servers {
		if c.Servers[i].Resync == 0 {
			c.Servers[i].Resync = defaultResync
		}
		if c.Servers[i].ProtocolVersion == "" && c.Servers[i].URL != "" {
			c.Servers[i].ProtocolVersion = defaultProtocol
		}
		if c.Servers[i].ClientCapabilities == nil && c.Servers[i].URL != "" {
			c.Servers[i].ClientCapabilities = slices.Clone(ClientCapabilityNames)
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func (c *Config) resolvePaths(dir string) {
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	c.PolicyFile = abs(c.PolicyFile)
	c.Audit.Path = abs(c.Audit.Path)
	for i := range c.Envelope.KeyFiles {
		c.Envelope.KeyFiles[i] = abs(c.Envelope.KeyFiles[i])
	}
	r := &c.Snapshots.Redis
	r.SecretFile, r.PasswordFile = abs(r.SecretFile), abs(r.PasswordFile)
	r.TLS.CAFile, r.TLS.CertFile, r.TLS.KeyFile = abs(r.TLS.CAFile), abs(r.TLS.CertFile), abs(r.TLS.KeyFile)
	for i := range c.Servers {
		c.Servers[i].CatalogFile = abs(c.Servers[i].CatalogFile)
		c.Servers[i].GrantKeyFile = abs(c.Servers[i].GrantKeyFile)
	}
	c.resolveAccessPaths(abs)
}

var (
	serverIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	headerPattern   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
	protocols       = []string{"2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"}
)

// Validate reports the first problem it finds, naming the field.
func (c Config) Validate() error {
	if err := validAddr(c.GRPCAddr); err != nil {
		return fmt.Errorf("grpc_addr: %w", err)
	}
	if err := validAddr(c.AdminAddr); err != nil {
		return fmt.Errorf("admin_addr: %w", err)
	}
	if c.GRPCAddr == c.AdminAddr {
		return fmt.Errorf("admin_addr: same as grpc_addr %q", c.GRPCAddr)
	}
	if err := c.validateAccess(); err != nil {
		return err
	}
	if c.PolicyFile == "" {
		return errors.New("policy_file: required")
	}
	if c.Drain < 0 || c.Drain > time.Minute {
		return fmt.Errorf("drain: %s is outside 0..1m", c.Drain)
	}
	if c.PolicyPoll < 100*time.Millisecond {
		return fmt.Errorf("policy_poll_interval: %s is below 100ms", c.PolicyPoll)
	}
	if err := c.Denials.validate(); err != nil {
		return fmt.Errorf("denials.%w", err)
	}
	if err := c.Principal.validate(); err != nil {
		return fmt.Errorf("principal.%w", err)
	}
	if c.Snapshots.TTL < time.Second || c.Snapshots.TTL > MaxSnapshotTTL {
		return fmt.Errorf("snapshots.ttl: %s is outside 1s..%s", c.Snapshots.TTL, MaxSnapshotTTL)
	}
	// The cache's admission sketch grows with this bound (per pinned tool),
	// so the ceiling is what fits comfortably in memory.
	if c.Snapshots.MaxSnapshots < 1 || c.Snapshots.MaxSnapshots > 1_000_000 {
		return fmt.Errorf("snapshots.max_snapshots: %d is outside 1..1000000", c.Snapshots.MaxSnapshots)
	}
	if c.Envelope.TTL < time.Second || c.Envelope.TTL > MaxEnvelopeTTL {
		return fmt.Errorf("envelope.ttl: %s is outside 1s..%s", c.Envelope.TTL, MaxEnvelopeTTL)
	}
	if err := c.Snapshots.validateStore(); err != nil {
		return fmt.Errorf("snapshots.%w", err)
	}
	switch c.Discovery.Bind {
	case BindDelivered, BindCatalog:
	default:
		return fmt.Errorf("discovery.bind: %q is not %s or %s", c.Discovery.Bind, BindDelivered, BindCatalog)
	}
	if c.Discovery.MaxResponseBytes < 1024 || c.Discovery.MaxResponseBytes > 64<<20 {
		return fmt.Errorf("discovery.max_response_bytes: %d is outside 1024..%d", c.Discovery.MaxResponseBytes, 64<<20)
	}
	if c.Catalog.MaxAge < time.Second {
		return fmt.Errorf("catalog.max_age: %s is below 1s", c.Catalog.MaxAge)
	}
	if len(c.Servers) == 0 {
		return errors.New("servers: at least one server is required")
	}
	seen := map[string]bool{}
	for i, s := range c.Servers {
		if err := s.validate(); err != nil {
			return fmt.Errorf("servers[%d].%w", i, err)
		}
		if s.URL != "" && s.Resync >= c.Catalog.MaxAge {
			return fmt.Errorf("servers[%d].resync_interval: %s is not below catalog.max_age %s; the catalog would go stale between resyncs", i, s.Resync, c.Catalog.MaxAge)
		}
		if seen[s.ID] {
			return fmt.Errorf("servers[%d].id: %q is listed twice", i, s.ID)
		}
		if s.GrantKeyFile != "" && len(c.Envelope.KeyFiles) == 0 {
			return fmt.Errorf("servers[%d].grant_key_file: set without envelope.key_files, which sign its grants", i)
		}
		seen[s.ID] = true
	}
	if c.Limits.MaxBodyBytes < 1024 || c.Limits.MaxBodyBytes > 64<<20 {
		return fmt.Errorf("limits.max_body_bytes: %d is outside 1024..%d", c.Limits.MaxBodyBytes, 64<<20)
	}
	if c.Limits.MaxDepth < 8 || c.Limits.MaxDepth > 1000 {
		return fmt.Errorf("limits.max_depth: %d is outside 8..1000", c.Limits.MaxDepth)
	}
	if i := c.Audit.CheckpointInterval; i != 0 && (i < time.Second || i > MaxCheckpointInterval) {
		return fmt.Errorf("audit.checkpoint_interval: %s is outside 1s..%s", i, MaxCheckpointInterval)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log.level: %q is not debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Format {
	case "json", "console":
	default:
		return fmt.Errorf("log.format: %q is not json or console", c.Log.Format)
	}
	return nil
}

func (s Snapshots) validateStore() error {
	switch s.Store {
	case StoreMemory:
		if s.Redis.Addr != "" {
			return fmt.Errorf("redis.addr: set, but store is %s; say store: %s to use it", StoreMemory, StoreRedis)
		}
		return nil
	case StoreRedis:
	default:
		return fmt.Errorf("store: %q is not %s or %s", s.Store, StoreMemory, StoreRedis)
	}
	r := s.Redis
	switch {
	case r.Addr == "":
		return errors.New("redis.addr: required with store redis")
	case validAddr(r.Addr) != nil:
		return fmt.Errorf("redis.addr: %w", validAddr(r.Addr))
	case r.SecretFile == "":
		return errors.New("redis.secret_file: required: without a shared secret, write access to Redis would mint snapshots")
	case r.DB < 0 || r.DB > 15:
		return fmt.Errorf("redis.db: %d is outside 0..15", r.DB)
	case r.Timeout < 10*time.Millisecond || r.Timeout > 5*time.Second:
		return fmt.Errorf("redis.timeout: %s is outside 10ms..5s", r.Timeout)
	case r.ProbeInterval < 50*time.Millisecond || r.ProbeInterval > 10*time.Second:
		return fmt.Errorf("redis.probe_interval: %s is outside 50ms..10s", r.ProbeInterval)
	case (r.TLS.CertFile == "") != (r.TLS.KeyFile == ""):
		return errors.New("redis.tls: cert_file and key_file go together")
	case r.TLS.CAFile == "" && (r.TLS.CertFile != "" || r.TLS.ServerName != ""):
		return errors.New("redis.tls.ca_file: required to use TLS")
	}
	return nil
}

func (d Denials) validate() error {
	switch d.Status {
	case StatusOK, StatusHTTPError:
	default:
		return fmt.Errorf("status: %q is not %s or %s", d.Status, StatusOK, StatusHTTPError)
	}
	switch d.CallForm {
	case CallFormError:
	case CallFormToolResult:
		if d.Status != StatusOK {
			return fmt.Errorf("call_form: %s is a result, which only status %s can carry", CallFormToolResult, StatusOK)
		}
	default:
		return fmt.Errorf("call_form: %q is not %s or %s", d.CallForm, CallFormError, CallFormToolResult)
	}
	return nil
}

func (p Principal) validate() error {
	switch p.Source {
	case SourceMTLS:
	case SourceJWT:
		if p.JWT.MetadataNamespace == "" || p.JWT.PayloadKey == "" || p.JWT.Claim == "" {
			return errors.New("jwt: metadata_namespace, payload_key and claim are required")
		}
	case SourceHeader:
		if !p.InsecureHeader {
			return errors.New("source: \"header\" trusts whatever the client sends; set insecure_header: true to accept that in development")
		}
		if !headerPattern.MatchString(p.Header) {
			return fmt.Errorf("header: %q is not a lower-case header name", p.Header)
		}
	default:
		return fmt.Errorf("source: %q is not mtls, jwt or header", p.Source)
	}
	if p.InsecureHeader && p.Source != SourceHeader {
		return errors.New("insecure_header: set, but source is not \"header\"")
	}
	return nil
}

func (s Server) validate() error {
	if !serverIDPattern.MatchString(s.ID) {
		return fmt.Errorf("id: %q must match %s", s.ID, serverIDPattern)
	}
	switch {
	case s.URL != "" && s.CatalogFile != "":
		return errors.New("url: set together with catalog_file; choose one")
	case s.URL == "" && s.CatalogFile == "":
		return errors.New("url: one of url and catalog_file is required")
	case s.URL != "":
		u, err := url.Parse(s.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("url: %q is not an http(s) URL", s.URL)
		}
		if !slices.Contains(protocols, s.ProtocolVersion) {
			return fmt.Errorf("protocol_version: %q is not one of %s", s.ProtocolVersion, strings.Join(protocols, ", "))
		}
	case s.ProtocolVersion != "":
		return errors.New("protocol_version: only applies with url")
	case s.ClientCapabilities != nil:
		return errors.New("client_capabilities: only applies with url")
	}
	for _, c := range s.ClientCapabilities {
		if !slices.Contains(ClientCapabilityNames, c) {
			return fmt.Errorf("client_capabilities: %q is not one of %s", c, strings.Join(ClientCapabilityNames, ", "))
		}
	}
	if s.Resync < time.Second {
		return fmt.Errorf("resync_interval: %s is below 1s", s.Resync)
	}
	return nil
}

func validAddr(a string) error {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%q: %w", a, err)
	}
	if port == "" {
		return fmt.Errorf("%q: no port", a)
	}
	return nil
}
