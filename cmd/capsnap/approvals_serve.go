package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/policy"
)

// approvalsFor refuses a policy that holds calls for approval, or puts
// tools under change control, when approvals are off: every such call, or
// every changed tool, would fail closed, unexplained.
func approvalsFor(cfg config.Config, p *policy.Policy) error {
	if p.HoldsForApproval() && cfg.Approvals.Addr == "" {
		return fmt.Errorf("policy %s holds calls for a person's approval, but approvals.addr is not set: configure approvals (docs/APPROVALS.md)", cfg.PolicyFile)
	}
	if p.UnderChangeControl() && cfg.Approvals.Addr == "" {
		return fmt.Errorf("policy %s puts tools under change control, whose changes wait for reviewers, but approvals.addr is not set: configure approvals (docs/APPROVALS.md)", cfg.PolicyFile)
	}
	return nil
}

// approverAuth is how approvers prove who they are, as a configures it:
// development tokens, or JWTs against a JWKS (read now: a file, or the URL
// fetched).
func approverAuth(a config.Approvals, log zerolog.Logger) (approval.Authenticator, error) {
	var auth approval.Authenticator
	var err error
	if a.Auth.DevTokensFile != "" {
		auth, err = approval.LoadDevTokens(a.Auth.DevTokensFile, log)
	} else {
		auth, err = approval.NewJWT(approval.JWTConfig{JWKSFile: a.Auth.JWKSFile, JWKSURL: a.Auth.JWKSURL,
			Issuer: a.Auth.Issuer, Audience: a.Auth.Audience, IdentityClaim: a.Auth.IdentityClaim, GroupsClaim: a.Auth.GroupsClaim})
	}
	if err != nil {
		return nil, fmt.Errorf("approvals.auth: %w", err)
	}
	return auth, nil
}

// openApprovals is the approval service and the server of its page and
// API, or nil, nil with approvals off. Requests live where snapshots do:
// in this process, or in the Redis every replica shares. Every request,
// decision, use and lapse is a line of the audit trail.
func openApprovals(cfg config.Config, auth approval.Authenticator, st *backend, auditLog, log zerolog.Logger, reg prometheus.Registerer) (*approval.Service, *http.Server, error) {
	a := cfg.Approvals
	if a.Addr == "" {
		return nil, nil, nil
	}
	requests := st.Approvals()
	base := a.BaseURL
	if base == "" {
		base = "http://" + a.Addr
	}
	svc, err := approval.New(approval.Config{
		Store: requests, BaseURL: strings.TrimSuffix(base, "/"), PendingTTL: a.PendingTTL,
		DeniedFor: a.DeniedFor, MaxNew: a.MaxRequestsPerPrincipal, Window: a.RequestsWindow,
		Audit:      auditApproval(auditLog),
		Webhook:    approval.WebhookConfig{URL: a.Webhook.URL, Timeout: a.Webhook.Timeout},
		Registerer: reg, Log: log.With().Str("component", "approvals").Logger(),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("approvals: %w", err)
	}
	// Replicas behind one URL check each other's forms: the key comes from
	// the secret they share. One replica's memory store has none, and the
	// handler then makes a key of its own.
	var csrf []byte
	if st.listingKey != nil {
		mac := hmac.New(sha256.New, st.listingKey)
		mac.Write([]byte("capsnap approval csrf key v1"))
		csrf = mac.Sum(nil)
	}
	h, err := approval.NewHandler(approval.HandlerOptions{Service: svc, Auth: auth, CSRFKey: csrf, Log: log})
	if err != nil {
		svc.Close()
		return nil, nil, fmt.Errorf("approvals: %w", err)
	}
	return svc, &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}, nil
}

// auditApproval writes each change to an approval request to the audit
// trail, chained and signed with the decisions: what was asked (the
// arguments' digest, never the arguments), who decided, when it was used.
func auditApproval(auditLog zerolog.Logger) func(approval.Event) {
	return func(e approval.Event) {
		r, b := e.Request, e.Request.Binding
		ev := auditLog.Log().Str("event", string(e.Kind)).Str("approval_id", r.ID).Str("state", string(r.State)).
			Str("principal", b.Principal).Str("server_id", b.Server).Str("tool", b.Tool).
			Str("schema_digest", b.SchemaDigest).Str("policy_digest", b.PolicyDigest).Str("arguments_digest", b.ArgsDigest).
			Time("expires_at", r.Expires)
		if e.Approver.ID != "" {
			ev = ev.Str("approver", e.Approver.ID).Strs("approver_groups", e.Approver.Groups)
		}
		if r.Reason != "" {
			ev = ev.Str("approver_reason", r.Reason)
		}
		ev.Msg("approval")
	}
}
