// Package config is capsnap's configuration file: what it listens on, which
// MCP servers it guards, where the principal comes from and which policy
// applies. Decoding is strict and Validate names the field that is wrong, so
// a typo stops the binary at start instead of silently weakening a check.
package config

import (
	"fmt"
	"os"
	"strings"
	"time"
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
	// Mode is ModeEnforce (the default) or ModeObserve, for every server
	// whose own Mode is empty.
	Mode string `yaml:"mode"`
	// Tracing exports a span per decision to an OpenTelemetry collector.
	Tracing Tracing `yaml:"tracing"`
	// Approvals serves the approval page and API, where people approve
	// the calls the policy holds for approval (docs/APPROVALS.md).
	Approvals Approvals `yaml:"approvals"`
}

// Approvals configures human approval of exact calls.
type Approvals struct {
	// Addr is the approval page and API's listener; empty turns approvals
	// off, and a policy with an approval rule is then refused.
	Addr string `yaml:"addr"`
	// BaseURL is where approvers reach Addr (behind a proxy, its public
	// URL); empty means http://Addr.
	BaseURL string `yaml:"base_url"`
	// PendingTTL is how long a request waits for a person before it lapses.
	PendingTTL time.Duration `yaml:"pending_ttl"`
	// DeniedFor is how long a person's denial of a call stands: the
	// identical call is denied approval_denied, with the reason, and
	// opens no request, until it passes.
	DeniedFor time.Duration `yaml:"denied_for"`
	// MaxRequestsPerPrincipal bounds the approval requests one principal
	// may open in RequestsWindow: past it, its held calls are denied
	// rate_limited and page no one.
	MaxRequestsPerPrincipal int           `yaml:"max_requests_per_principal"`
	RequestsWindow          time.Duration `yaml:"requests_window"`
	// Auth says how approvers prove who they are.
	Auth ApprovalAuth `yaml:"auth"`
	// Webhook, if URL is set, is told of every new request.
	Webhook Webhook `yaml:"webhook"`
}

// ApprovalAuth is the approvers' tokens: JWTs against a JWKS, or, for
// development only, a file of static tokens.
type ApprovalAuth struct {
	JWKSFile      string `yaml:"jwks_file"`
	JWKSURL       string `yaml:"jwks_url"`
	Issuer        string `yaml:"issuer"`
	Audience      string `yaml:"audience"`
	IdentityClaim string `yaml:"identity_claim"`
	GroupsClaim   string `yaml:"groups_claim"`
	// DevTokensFile maps static tokens to identities and groups: no
	// signature, no expiry. For the demo; never in production.
	DevTokensFile string `yaml:"dev_tokens_file"`
}

// Webhook is where new approval requests are announced: a JSON POST a
// Slack-style incoming webhook shows as text.
type Webhook struct {
	URL     string        `yaml:"url"`
	Timeout time.Duration `yaml:"timeout"`
}

// Tracing configures OpenTelemetry tracing: a span for each decision,
// continuing the trace Envoy started (W3C traceparent on the ext_authz and
// ext_proc calls), exported over OTLP/gRPC.
type Tracing struct {
	// Endpoint is the collector's OTLP/gRPC host:port; empty turns
	// tracing off.
	Endpoint string `yaml:"endpoint"`
	// Insecure sends spans in plaintext, as to a collector on loopback
	// or a node-local agent; otherwise TLS with the system's roots.
	Insecure bool `yaml:"insecure"`
	// SampleRatio is the share of traces capsnap starts itself that it
	// samples; a trace Envoy started keeps Envoy's decision.
	SampleRatio float64 `yaml:"sample_ratio"`
	// ServiceName is the service.name resource attribute.
	ServiceName string `yaml:"service_name"`
}

// Enforcement modes.
const (
	// ModeEnforce answers every decision as it is made.
	ModeEnforce = "enforce"
	// ModeObserve makes, audits and counts every decision as ModeEnforce
	// would, and enforces none: a request that would be denied passes, a
	// tools/list response passes as the server sent it. For rolling
	// capsnap out beside servers and agents already in use.
	ModeObserve = "observe"
)

// ServerIDs lists the configured servers' ids, in order.
func (c Config) ServerIDs() []string {
	ids := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		ids[i] = s.ID
	}
	return ids
}

// Observed lists the servers in ModeObserve.
func (c Config) Observed() []string {
	var ids []string
	for _, s := range c.Servers {
		if s.Mode == ModeObserve || (s.Mode == "" && c.Mode == ModeObserve) {
			ids = append(ids, s.ID)
		}
	}
	return ids
}

// Envelope configures the signed envelope capsnap sends the MCP server on
// every allowed tools/call (docs/ENVELOPE.md).
type Envelope struct {
	// KeyFiles are Ed25519 private keys (PEM PKCS #8, one or more blocks
	// a file): the first signs, all are published in the JWKS. None: no
	// envelope is sent. capsnap reads them again as they change, and
	// rotates: a new key is published PublishAhead before it signs, and
	// one no longer listed is published until what it signed expired.
	KeyFiles []string `yaml:"key_files"`
	// TTL is how long an envelope is valid, never past its snapshot.
	TTL time.Duration `yaml:"ttl"`
	// PublishAhead is how long a key new to the key files is published
	// before it signs: at least the verifiers' JWKS refresh, with the
	// JWKS response's max-age and KeyPoll.
	PublishAhead time.Duration `yaml:"publish_ahead"`
	// KeyPoll is how often the key files are read for a change; SIGHUP
	// reads them at once.
	KeyPoll time.Duration `yaml:"key_poll_interval"`
}

// Outlive is how long an envelope key stays published after it last
// signed: the longest anything it signed is valid (an envelope; a grant,
// which lives as long as its snapshot), and a minute for the verifiers'
// leeway and clocks.
func (c Config) Outlive() time.Duration {
	return max(c.Envelope.TTL, c.Snapshots.TTL) + time.Minute
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
	// Mode overrides the top-level mode for this server.
	Mode string `yaml:"mode"`
	// ReleaseOnError gives back what a call reserved of its budgets and
	// rate limits when this server answers it with a JSON-RPC error or a
	// tool result with isError. Only for a server whose failures mean
	// nothing was done: a server that errs after moving the money would
	// hand the budget back for more.
	ReleaseOnError bool `yaml:"release_on_error"`
	// CallsWithoutListing lets a caller that holds no snapshot at all on
	// this server (a script that calls a fixed tool by name, never
	// listing) call: each such call is judged against the tool's live,
	// approved definition and the caller's grants, and audited as made
	// without a snapshot. Off by default: the design binds a call to what
	// was delivered, and only this opt-in lets a call through that was
	// not (docs/POLICY.md).
	CallsWithoutListing bool `yaml:"calls_without_listing"`
}

// ReleasingOnError lists the servers with release_on_error.
func (c Config) ReleasingOnError() []string {
	return c.serversWhere(func(s Server) bool { return s.ReleaseOnError })
}

// CallingWithoutListing lists the servers with calls_without_listing.
func (c Config) CallingWithoutListing() []string {
	return c.serversWhere(func(s Server) bool { return s.CallsWithoutListing })
}

func (c Config) serversWhere(f func(Server) bool) []string {
	var ids []string
	for _, s := range c.Servers {
		if f(s) {
			ids = append(ids, s.ID)
		}
	}
	return ids
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

// Redis is the shared snapshot store of several replicas: a Redis (or
// Valkey) 6 or later, as the store relies on RESP3 client-side caching.
// Exactly one of Addr, Cluster and Sentinel says where it is.
type Redis struct {
	// Addr is host:port of one Redis.
	Addr string `yaml:"addr"`
	// Cluster is a Redis Cluster.
	Cluster RedisCluster `yaml:"cluster"`
	// Sentinel is a Redis whose master Sentinel fails over to a replica.
	Sentinel RedisSentinel `yaml:"sentinel"`
	Username string        `yaml:"username"`
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

// RedisCluster is a Redis Cluster.
type RedisCluster struct {
	// Addrs are seed nodes, host:port: capsnap learns the others, and
	// follows slots as they move. Two or three, in case one is down.
	Addrs []string `yaml:"addrs"`
}

// RedisSentinel is a Redis master set that Sentinel watches.
type RedisSentinel struct {
	// MasterSet is the name the sentinels monitor the master under.
	MasterSet string `yaml:"master_set"`
	// Addrs are sentinels, host:port.
	Addrs []string `yaml:"addrs"`
	// Username and PasswordFile authenticate to the sentinels, if they
	// require it (Redis's own are Redis.Username and PasswordFile).
	Username     string `yaml:"username"`
	PasswordFile string `yaml:"password_file"`
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
	return readPasswordFile("snapshots.redis.password_file", r.PasswordFile)
}

// ReadPassword reads the sentinels' password file, if one is configured.
func (s RedisSentinel) ReadPassword() (string, error) {
	return readPasswordFile("snapshots.redis.sentinel.password_file", s.PasswordFile)
}

// readPasswordFile reads a password, less its final newline; none if no
// file is named.
func readPasswordFile(setting, file string) (string, error) {
	if file == "" {
		return "", nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", setting, err)
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
		Envelope:  Envelope{TTL: 30 * time.Second, PublishAhead: 10 * time.Minute, KeyPoll: 2 * time.Second},
		Catalog:   Catalog{MaxAge: 2 * time.Minute},
		Limits:    Limits{MaxBodyBytes: 1 << 20, MaxDepth: 64},
		Log:       Log{Level: "info", Format: "json"},
		Mode:      ModeEnforce,
		Tracing:   Tracing{SampleRatio: 1, ServiceName: "capsnap"},
		Approvals: Approvals{PendingTTL: 15 * time.Minute, DeniedFor: time.Hour, MaxRequestsPerPrincipal: 20, RequestsWindow: time.Hour,
			Auth: ApprovalAuth{IdentityClaim: "sub", GroupsClaim: "groups"}, Webhook: Webhook{Timeout: 5 * time.Second}},
	}
}

const (
	defaultResync   = 30 * time.Second
	defaultProtocol = "2025-11-25"
)
