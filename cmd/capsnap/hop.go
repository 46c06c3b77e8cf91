package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/mtls"
)

// hop guards the two ways into capsnap: grpc_addr, where Envoy sends
// Checks and tools/list responses (mTLS with an allowlist, grpc_tls), and
// admin_addr's endpoints that change state or expose memory (a bearer
// token, admin.token_file).
type hop struct {
	tls    *mtls.Server // nil: grpc_addr is plaintext
	maxAge time.Duration
	admin  config.Admin // TokenFile "": admin_addr is loopback, and open
	log    zerolog.Logger
	// refusals logs refused admin requests, a few a second at most.
	refusals zerolog.Logger
}

// connectionAgeGrace is how long in-flight calls may go on after capsnap
// asked a client to reconnect (max_connection_age): a Check takes
// microseconds, a tools/list response's ext_proc stream as long as the
// MCP server takes to send it.
const connectionAgeGrace = 30 * time.Second

// newHop loads what guards the listeners: the TLS material (which must be
// good) and the admin token (which must be readable and long enough).
// `capsnap check` runs it too.
func newHop(cfg config.Config, log zerolog.Logger) (*hop, error) {
	h := &hop{maxAge: cfg.GRPCTLS.MaxConnectionAge, admin: cfg.Admin, log: log}
	h.refusals = log.Sample(&zerolog.BurstSampler{Burst: 5, Period: time.Second})
	if t := cfg.GRPCTLS; t.Enabled() {
		s, err := mtls.New(mtls.Options{
			CertFile: t.CertFile, KeyFile: t.KeyFile, ClientCAFile: t.ClientCAFile,
			Allowed: t.AllowedClients, ReloadInterval: t.ReloadInterval, Logger: log,
		})
		if err != nil {
			return nil, fmt.Errorf("grpc_tls: %w", err)
		}
		h.tls = s
		serial, notAfter := s.Current()
		log.Info().Strs("allowed_clients", s.Identities()).Str("serial", serial).Time("not_after", notAfter).
			Int64("max_connection_age_ms", h.maxAge.Milliseconds()).Msg("grpc_addr requires TLS with an allowed client certificate")
	} else if !config.Loopback(cfg.GRPCAddr) {
		log.Warn().Str("grpc_addr", cfg.GRPCAddr).
			Msg("grpc_addr is plaintext beyond loopback: whoever reaches it can send Checks naming any principal; set grpc_tls, or keep a mesh's mTLS and an authorization policy in front")
	}
	if h.admin.TokenFile != "" {
		if _, err := h.admin.ReadToken(); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// grpcOptions are the gRPC server's options for grpc_tls: the handshake
// that admits only allowed clients, and connections that end after
// max_connection_age, so that every client handshakes again against the
// material in force.
func (h *hop) grpcOptions() []grpc.ServerOption {
	if h.tls == nil {
		return nil
	}
	return []grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(h.tls.TLSConfig())),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: h.maxAge, MaxConnectionAgeGrace: connectionAgeGrace}),
	}
}

// run reloads the TLS material when it changes on disk, until ctx ends.
func (h *hop) run(ctx context.Context) {
	if h.tls != nil {
		h.tls.Run(ctx)
	}
}

// guardAdmin puts the token in front of the admin endpoints that need it.
// Without a token file (admin_addr is then loopback) it leaves them open.
func (h *hop) guardAdmin(mux *http.ServeMux) http.Handler {
	if h.admin.TokenFile == "" {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The pattern the mux would route the request to, so that no
		// spelling of a path reaches a guarded handler unguarded.
		if _, pattern := mux.Handler(r); needsToken(r.Method, pattern) {
			if status, why := h.authorize(r); status != 0 {
				h.refusals.Warn().Str("remote", r.RemoteAddr).Str("method", r.Method).Str("path", r.URL.Path).
					Int("status", status).Str("why", why).Msg("admin request refused")
				w.Header().Set("Content-Type", "application/json")
				if status == http.StatusUnauthorized {
					w.Header().Set("WWW-Authenticate", `Bearer realm="capsnap-admin"`)
				}
				w.WriteHeader(status)
				_ = json.NewEncoder(w).Encode(map[string]string{"result": "unauthorized", "error": why})
				return
			}
		}
		mux.ServeHTTP(w, r)
	})
}

// needsToken says which admin requests the token guards: every one that
// is not a GET (POST /policy/reload, and whatever a later endpoint
// changes), the profiles, which show the heap, and the budgets, which
// show a principal's calls. The probes, the metrics, the catalog view and
// the public keys stay open.
func needsToken(method, pattern string) bool {
	return (method != http.MethodGet && method != http.MethodHead) || strings.HasPrefix(pattern, "GET /debug/pprof/") || pattern == "GET /budgets"
}

// authorize checks the request's bearer token against the token file, read
// now, so that replacing the file rotates the token. It returns 0, or the
// status to refuse with and why.
func (h *hop) authorize(r *http.Request) (int, string) {
	want, err := h.admin.ReadToken()
	if err != nil {
		h.log.Error().Err(err).Msg("admin token unreadable: refusing the admin endpoints it guards")
		return http.StatusServiceUnavailable, "the admin token is unreadable"
	}
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return http.StatusUnauthorized, "send Authorization: Bearer <admin.token_file's token> (capsnap policy reload --token-file FILE)"
	}
	// Digests of equal length, compared in constant time: the comparison
	// says nothing of how much of a guess was right, or of the length.
	a, b := sha256.Sum256(want), sha256.Sum256([]byte(strings.TrimSpace(got)))
	if subtle.ConstantTimeCompare(a[:], b[:]) != 1 {
		return http.StatusUnauthorized, "the bearer token is not admin.token_file's"
	}
	return 0, ""
}
