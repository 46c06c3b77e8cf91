package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Validate and the checks of each section, each naming the field it refuses.

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
	if c.Envelope.PublishAhead < 0 || c.Envelope.PublishAhead > 24*time.Hour {
		return fmt.Errorf("envelope.publish_ahead: %s is outside 0..24h", c.Envelope.PublishAhead)
	}
	if c.Envelope.KeyPoll < 100*time.Millisecond {
		return fmt.Errorf("envelope.key_poll_interval: %s is below 100ms", c.Envelope.KeyPoll)
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
	if err := validMode(c.Mode); err != nil {
		return fmt.Errorf("mode: %w", err)
	}
	if err := c.Tracing.validate(); err != nil {
		return fmt.Errorf("tracing.%w", err)
	}
	if err := c.Approvals.validate(c.GRPCAddr, c.AdminAddr); err != nil {
		return fmt.Errorf("approvals.%w", err)
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
	r := s.Redis
	where := r.where()
	switch s.Store {
	case StoreMemory:
		if len(where) > 0 {
			return fmt.Errorf("redis.%s: set, but store is %s; say store: %s to use it", where[0], StoreMemory, StoreRedis)
		}
		return nil
	case StoreRedis:
	default:
		return fmt.Errorf("store: %q is not %s or %s", s.Store, StoreMemory, StoreRedis)
	}
	if err := r.validateWhere(where); err != nil {
		return err
	}
	switch {
	case strings.ContainsAny(r.KeyPrefix, "{}"):
		return fmt.Errorf("redis.key_prefix: %q holds a brace: capsnap hash-tags its keys itself, and a brace in the prefix would put every key in one Redis Cluster slot", r.KeyPrefix)
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

// where names the settings that say where Redis is.
func (r Redis) where() []string {
	var out []string
	if r.Addr != "" {
		out = append(out, "addr")
	}
	if len(r.Cluster.Addrs) > 0 {
		out = append(out, "cluster")
	}
	if r.Sentinel.MasterSet != "" || len(r.Sentinel.Addrs) > 0 {
		out = append(out, "sentinel")
	}
	return out
}

func (r Redis) validateWhere(where []string) error {
	switch {
	case len(where) == 0:
		return errors.New("redis.addr: required with store redis (or redis.cluster, or redis.sentinel)")
	case len(where) > 1:
		return fmt.Errorf("redis: %s are set; say where Redis is with exactly one of addr, cluster and sentinel", strings.Join(where, " and "))
	case r.Addr != "":
		if err := validAddr(r.Addr); err != nil {
			return fmt.Errorf("redis.addr: %w", err)
		}
	case len(r.Cluster.Addrs) > 0:
		if r.DB != 0 {
			return fmt.Errorf("redis.db: %d, but a cluster has database 0 only", r.DB)
		}
		return validAddrs("redis.cluster.addrs", r.Cluster.Addrs)
	default:
		if r.Sentinel.MasterSet == "" {
			return errors.New("redis.sentinel.master_set: required with redis.sentinel")
		}
		if len(r.Sentinel.Addrs) == 0 {
			return errors.New("redis.sentinel.addrs: required with redis.sentinel")
		}
		return validAddrs("redis.sentinel.addrs", r.Sentinel.Addrs)
	}
	return nil
}

func validAddrs(setting string, addrs []string) error {
	for i, a := range addrs {
		if err := validAddr(a); err != nil {
			return fmt.Errorf("%s[%d]: %w", setting, i, err)
		}
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
	if s.Mode != "" {
		if err := validMode(s.Mode); err != nil {
			return fmt.Errorf("mode: %w", err)
		}
	}
	return nil
}

func (a Approvals) validate(taken ...string) error {
	if a.Addr == "" {
		return nil
	}
	if err := validAddr(a.Addr); err != nil {
		return fmt.Errorf("addr: %w", err)
	}
	if slices.Contains(taken, a.Addr) {
		return fmt.Errorf("addr: %s is grpc_addr's or admin_addr's", a.Addr)
	}
	if a.BaseURL != "" {
		u, err := url.Parse(a.BaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" && u.Path != "/" {
			return fmt.Errorf("base_url: %q is not an http(s) URL without a path", a.BaseURL)
		}
	}
	if a.PendingTTL < time.Minute || a.PendingTTL > 24*time.Hour {
		return fmt.Errorf("pending_ttl: %s is outside 1m..24h", a.PendingTTL)
	}
	// A denial stands no longer than the store keeps the request it is.
	if a.DeniedFor < 0 || a.DeniedFor > 24*time.Hour {
		return fmt.Errorf("denied_for: %s is outside 0..24h", a.DeniedFor)
	}
	if a.MaxRequestsPerPrincipal < 1 {
		return fmt.Errorf("max_requests_per_principal: %d; at least 1", a.MaxRequestsPerPrincipal)
	}
	if a.RequestsWindow < time.Minute || a.RequestsWindow > 24*time.Hour {
		return fmt.Errorf("requests_window: %s is outside 1m..24h", a.RequestsWindow)
	}
	switch au := a.Auth; {
	case au.DevTokensFile != "" && (au.JWKSFile != "" || au.JWKSURL != ""):
		return errors.New("auth.dev_tokens_file: set together with a JWKS; choose one")
	case au.DevTokensFile != "":
	case (au.JWKSFile == "") == (au.JWKSURL == ""):
		return errors.New("auth: exactly one of jwks_file and jwks_url is required (or dev_tokens_file, for development)")
	case au.Issuer == "" || au.Audience == "":
		return errors.New("auth: issuer and audience are required with a JWKS")
	}
	if a.Webhook.URL != "" {
		u, err := url.Parse(a.Webhook.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("webhook.url: %q is not an http(s) URL", a.Webhook.URL)
		}
	}
	return nil
}

func (t Tracing) validate() error {
	if t.Endpoint != "" {
		if err := validAddr(t.Endpoint); err != nil {
			return fmt.Errorf("endpoint: %w", err)
		}
	}
	if t.SampleRatio < 0 || t.SampleRatio > 1 {
		return fmt.Errorf("sample_ratio: %v is outside 0..1", t.SampleRatio)
	}
	if t.ServiceName == "" {
		return errors.New("service_name: required")
	}
	return nil
}

func validMode(m string) error {
	if m != ModeEnforce && m != ModeObserve {
		return fmt.Errorf("%q is not %s or %s", m, ModeEnforce, ModeObserve)
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
