package main

import (
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/config"
)

// check and serve load a configuration with one loader, so they agree on
// every setup: what serve refuses to start on, check refuses with the same
// error; what serve starts on, check passes, unless check finds what only
// it looks for (a policy's tool the server does not list, an argument no
// tool declares), which serve cannot know before the catalog is live.
func TestCheckAgreesWithServe(t *testing.T) {
	for _, tc := range []struct {
		config string
		// refused is in the error both give, or "" when serve starts.
		refused string
		// checkOnly is in check's findings when serve starts and check
		// refuses.
		checkOnly string
	}{
		{config: "ok.yaml"},
		{config: "envelope.yaml"},
		{config: "grant.yaml"},
		{config: "bad-policy.yaml", refused: `tools[0].effect: unknown effect class "superuser"`},
		{config: "bad-catalog.yaml", refused: `tool "a" is listed twice`},
		{config: "redis-short-secret.yaml", refused: "short.key holds 9 bytes, fewer than 32"},
		{config: "grant-private-key.yaml", refused: `want a PEM "PUBLIC KEY"`},
		{config: "approvals-off.yaml", refused: "approvals.addr is not set"},
		{config: "changes-off.yaml", refused: "approvals.addr is not set"},
		{config: "approvals-no-tokens.yaml", refused: "approvals.auth: approval: dev tokens: open"},
		{config: "unknown-server.yaml", refused: `principals[0].grants[1]: server "biling" is not configured (did you mean "billing"?)`},
		{config: "audit-dir-missing.yaml", refused: "audit.path: stat"},
		{config: "missing-tool.yaml", checkOnly: `billing/refnd is classified, but server billing does not list refnd (did you mean "refund"?)`},
		{config: "typo.yaml", checkOnly: "reads args.amount_usd, which the input schema of billing/refund does not declare"},
	} {
		t.Run(tc.config, func(t *testing.T) {
			path := filepath.Join("testdata", tc.config)
			var stderr strings.Builder
			checkErr := check(path, "", false, 0, io.Discard, &stderr)

			cfg, err := config.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			cfg.GRPCAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
			if cfg.Approvals.Addr != "" {
				cfg.Approvals.Addr = "127.0.0.1:0"
			}
			if cfg.Audit.Path == "" {
				cfg.Audit.Path = filepath.Join(t.TempDir(), "audit.jsonl")
			}
			svc, serveErr := newService(cfg, io.Discard, io.Discard)
			if serveErr == nil {
				svc.close()
			}

			switch {
			case tc.refused != "":
				if serveErr == nil || checkErr == nil {
					t.Fatalf("serve: %v; check: %v; want both refused", serveErr, checkErr)
				}
				if serveErr.Error() != checkErr.Error() || !strings.Contains(checkErr.Error(), tc.refused) {
					t.Errorf("serve: %v\ncheck: %v\nwant the same error, containing %q", serveErr, checkErr, tc.refused)
				}
			case serveErr != nil:
				t.Fatalf("serve refused: %v", serveErr)
			case tc.checkOnly != "":
				if checkErr == nil || !strings.Contains(stderr.String(), tc.checkOnly) {
					t.Errorf("check: %v, stderr %q; want a finding containing %q", checkErr, stderr.String(), tc.checkOnly)
				}
			case checkErr != nil:
				t.Errorf("serve starts, check refused: %v\n%s", checkErr, stderr.String())
			}
		})
	}
}
