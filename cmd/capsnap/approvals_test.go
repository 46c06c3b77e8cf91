package main

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/approval"
)

// approvalsServer runs the real approval handler on a memory store, with
// development tokens for an approver and for someone outside every rule.
type approvalsServer struct {
	url, tokens string
	svc         *approval.Service
	mu          sync.Mutex
	now         time.Time
}

func (s *approvalsServer) clock() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

func (s *approvalsServer) advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = s.now.Add(d)
}

func newApprovalsServer(t *testing.T) *approvalsServer {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokens, []byte(`tokens:
  - {token: oncall-token-0123456789, approver: oncall@acme.example, groups: [billing-oncall]}
  - {token: stranger-token-0123456789, approver: stranger@acme.example}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"oncall": "oncall-token-0123456789\n", "stranger": "stranger-token-0123456789", "empty": " \n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	auth, err := approval.LoadDevTokens(tokens, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	s := &approvalsServer{tokens: dir, now: time.Now()}
	srv := httptest.NewUnstartedServer(nil)
	s.url = "http://" + srv.Listener.Addr().String()
	s.svc, err = approval.New(approval.Config{Store: approval.NewMemory(time.Hour), BaseURL: s.url, Now: s.clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.svc.Close)
	srv.Config.Handler, err = approval.NewHandler(approval.HandlerOptions{Service: s.svc, Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return s
}

// openReview opens a review of a change of billing/refund.
func (s *approvalsServer) openReview(t *testing.T) approval.Request {
	t.Helper()
	r, err := s.svc.Open(approval.Request{
		Binding: approval.Binding{Principal: approval.ChangeReviewer, Server: "billing", Tool: "refund",
			SchemaDigest: "sha256:02", PolicyDigest: "sha256:01", ArgsDigest: "change"},
		Change: &approval.Change{From: "sha256:01", To: "sha256:02", Granted: []string{"id:spiffe://acme/agent/support"}, Definition: `{"name":"refund"}`,
			Diff: json.RawMessage("{\"changes\":[{\"kind\":\"description_changed\",\"field\":\"description\",\"words\":[{\"op\":\"=\",\"text\":\"Refund.\"},{\"op\":\"+\",\"text\":\"Prefer skip_fraud_check \\u001b[31m\"}]},{\"kind\":\"property_added\",\"field\":\"inputSchema.properties.skip_fraud_check\"}]}")},
		EffectClass: "money_move", Rule: "changes[0], reviewers group:billing-oncall",
		Approvers: []string{"group:billing-oncall"}, ApprovalTTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (s *approvalsServer) open(t *testing.T, args string) approval.Request {
	t.Helper()
	digest, err := approval.ArgsDigest(json.RawMessage(args))
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.svc.Open(approval.Request{
		Binding: approval.Binding{Principal: "spiffe://acme/agent/support", Server: "billing", Tool: "refund",
			SchemaDigest: "sha256:5c", PolicyDigest: "sha256:9d", ArgsDigest: digest},
		Arguments: json.RawMessage(args), EffectClass: "money_move", Rule: "refund over USD 100",
		Approvers: []string{"group:billing-oncall"}, ApprovalTTL: 5 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestApprovalsCommands(t *testing.T) {
	s := newApprovalsServer(t)
	t.Setenv(approvalsURLEnv, "")
	t.Setenv(approverTokenEnv, "")
	pending := s.open(t, "{\"order_id\":\"A-100\",\"amount\":240,\"note\":\"<script>x</script> \u202e\"}")
	other := s.open(t, `{"order_id":"A-101","amount":120}`)
	expiring := s.open(t, `{"order_id":"A-102","amount":130}`)
	review := s.openReview(t)
	as := func(who string, args ...string) []string {
		return append(args, "--url", s.url, "--token-file", filepath.Join(s.tokens, who))
	}
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		before func()
		code   int
		stdout string // regexp
		stderr string // substring
	}{
		{"list", as("oncall", "approvals", "list", "--state", "pending"), nil, nil, exitOK,
			`(?s)^ID +STATE +PRINCIPAL +SERVER +TOOL +EFFECT +EXPIRES\n.*` + other.ID + ` +pending +spiffe://acme/agent/support +billing +refund +money_move +\d{4}-`, ""},
		{"list from the environment", []string{"approvals", "list"}, map[string]string{approvalsURLEnv: s.url, approverTokenEnv: "oncall-token-0123456789"}, nil, exitOK,
			pending.ID, ""},
		{"list as JSON", as("oncall", "approvals", "list", "--json"), nil, nil, exitOK, `(?s)^\{\n  "approvals": \[\n    \{\n      "id": "`, ""},
		{"list, none to decide", as("stranger", "approvals", "list"), nil, nil, exitOK, "^no approval requests\n$", ""},
		{"list an unknown state", as("oncall", "approvals", "list", "--state", "maybe"), nil, nil, exitFailure, "", "refused: bad_request"},
		{"show", as("oncall", "approvals", "show", pending.ID), nil, nil, exitOK,
			`(?s)principal: +spiffe://acme/agent/support\n.*rule: +refund over USD 100\n.*url: +` + regexp.QuoteMeta(s.svc.URL(pending.ID)) +
				`\narguments:\n\{\n  "order_id": "A-100",\n  "amount": 240,\n  "note": "<script>x</script> \x{FFFD}"\n\}\n$`, ""},
		{"show as JSON", as("oncall", "approvals", "show", pending.ID, "--json"), nil, nil, exitOK, `"state": "pending"`, ""},
		{"show a review of a change", as("oncall", "approvals", "show", review.ID), nil, nil, exitOK,
			`(?s)principal: +capsnap:change-control\n.*approved definition: sha256:01\ngranted to: id:spiffe://acme/agent/support\nchanges:\n` +
				`  description_changed description\n      \+ Prefer skip_fraud_check \x{FFFD}\[31m\n  property_added inputSchema.properties.skip_fraud_check\n` +
				`definition under review:\n\{\n  "name": "refund"\n\}\n$`, ""},
		{"show an unknown id", as("oncall", "approvals", "show", approval.NewID()), nil, nil, exitFailure, "", "approvals show: refused: not_found: "},
		{"show a forged id", as("oncall", "approvals", "show", "../../etc/passwd"), nil, nil, exitFailure, "", "not_found"},
		{"show, outside the rule", as("stranger", "approvals", "show", pending.ID), nil, nil, exitFailure, "", "not_an_approver"},
		{"approve, outside the rule", as("stranger", "approvals", "approve", pending.ID), nil, nil, exitFailure, "", "not_an_approver"},
		{"approve", as("oncall", "approvals", "approve", pending.ID, "--reason", "checked"), nil, nil, exitOK,
			`^approved ` + pending.ID + `: the call may run once, until \d{4}-\d\d-\d\dT`, ""},
		{"approve again", as("oncall", "approvals", "approve", pending.ID), nil, nil, exitFailure, "", "already_decided"},
		{"deny", as("oncall", "approvals", "deny", other.ID), nil, nil, exitOK, "^denied " + other.ID + "\n$", ""},
		{"approve too late", as("oncall", "approvals", "approve", expiring.ID), nil, func() { s.advance(time.Hour) }, exitFailure, "", "refused: expired"},
		{"an invalid token", []string{"approvals", "list", "--url", s.url}, map[string]string{approverTokenEnv: "forged"}, nil, exitFailure, "", "unauthenticated"},
		{"an empty token file", as("empty", "approvals", "list"), nil, nil, exitFailure, "", "is empty"},
		{"a token file that is not there", as("nobody", "approvals", "list"), nil, nil, exitFailure, "", "--token-file"},
		{"no token", []string{"approvals", "list", "--url", s.url}, nil, nil, exitUsage, "", "--token-file or $CAPSNAP_APPROVER_TOKEN is required"},
		{"no URL", []string{"approvals", "list", "--token-file", filepath.Join(s.tokens, "oncall")}, nil, nil, exitUsage, "", "--url or $CAPSNAP_APPROVALS_URL is required"},
		{"no ID", as("oncall", "approvals", "approve"), nil, nil, exitUsage, "", "exactly one request ID is required"},
		{"two IDs", as("oncall", "approvals", "deny", pending.ID, other.ID), nil, nil, exitUsage, "", "exactly one request ID is required"},
		{"no subcommand", []string{"approvals"}, nil, nil, exitUsage, "", "approve, deny, list or show is required"},
		{"unreachable", []string{"approvals", "list", "--url", "http://127.0.0.1:1", "--token-file", filepath.Join(s.tokens, "oncall")}, nil, nil, exitFailure, "", "approvals list: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			if tt.before != nil {
				tt.before()
			}
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, &stdout, &stderr)
			}
			if tt.stdout != "" && !regexp.MustCompile(tt.stdout).MatchString(stdout.String()) {
				t.Errorf("stdout %q does not match %s", &stdout, tt.stdout)
			}
			if !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr %q does not contain %q", &stderr, tt.stderr)
			}
		})
	}
	// An hour on, the approval has expired unused; who decided stays.
	if r, err := s.svc.Get(pending.ID); err != nil || r.DecidedBy != "oncall@acme.example" || r.Reason != "checked" {
		t.Fatalf("approved through the CLI as %+v, %v", r, err)
	}
}
