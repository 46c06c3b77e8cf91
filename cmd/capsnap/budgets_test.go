package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/testbed"
)

const supportRefund = "spiffe://acme/agent/support-refund"

// running is capsnap running in process, and its log.
type running struct {
	*service
	stderr *testbed.SyncBuffer
}

// inProcess runs capsnap built from cfg as serve builds it, its listeners
// on port 0 and its audit trail in a file, until the test ends; it returns
// once capsnap is ready.
func inProcess(t *testing.T, cfg config.Config) running {
	t.Helper()
	cfg.GRPCAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Audit.Path = filepath.Join(t.TempDir(), "audit.jsonl")
	stderr := &testbed.SyncBuffer{}
	svc, err := newService(cfg, io.Discard, stderr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		svc.close()
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://" + svc.adminLis.Addr().String() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return running{svc, stderr}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after 10s: %v\n%s", err, stderr)
		}
	}
}

// decideCall decides an MCP request of principal's on billing, as Envoy
// hands it over, and returns why it was denied: "" if it was allowed.
func decideCall(t *testing.T, svc running, principal, body string) string {
	t.Helper()
	o := svc.srv.Decide(&decide.Request{
		Method: "POST", Body: []byte(body), ServerID: "billing", Peer: principal,
		Headers: map[string]string{":method": "POST", ":path": "/mcp", "content-type": "application/json", "accept": "application/json, text/event-stream"},
	})
	if o.Denial != nil {
		return string(o.Denial.Reason)
	}
	return ""
}

func refundCall(amount int) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"refund","arguments":{"order_id":"A-100","amount":%d,"reason_code":"damaged"}}}`, amount)
}

// showCounters runs budgets show --json against svc.
func showCounters(t *testing.T, o budgetsOptions) map[string]decide.Counter {
	t.Helper()
	o.json = true
	var stdout bytes.Buffer
	if err := budgetsShow(o, &stdout); err != nil {
		t.Fatal(err)
	}
	var out struct{ Counters []decide.Counter }
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	byName := map[string]decide.Counter{}
	for _, c := range out.Counters {
		byName[c.Name] = c
	}
	return byName
}

// capsnap budgets shows what calls took, as the store holds it, and resets
// one counter, audited: on the memory store, and on Redis.
func TestBudgetsCommand(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(t *testing.T, cfg *config.Config)
	}{
		{"memory", func(*testing.T, *config.Config) {}},
		{"redis", func(t *testing.T, cfg *config.Config) {
			cfg.Snapshots.Store = config.StoreRedis
			cfg.Snapshots.Redis.Addr = testbed.StartRedis(t).Addr()
			cfg.Snapshots.Redis.SecretFile = secretFile(t)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := config.Load("testdata/budgets.yaml")
			if err != nil {
				t.Fatal(err)
			}
			tt.edit(t, &cfg)
			svc := inProcess(t, cfg)
			if r := decideCall(t, svc, supportRefund, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); r != "" {
				t.Fatalf("tools/list: %s", r)
			}
			for _, amount := range []int{200, 150} {
				if r := decideCall(t, svc, supportRefund, refundCall(amount)); r != "" {
					t.Fatalf("refund of %d: %s", amount, r)
				}
			}
			o := budgetsOptions{adminOptions: adminOptions{admin: svc.adminLis.Addr().String()},
				principal: supportRefund, server: "billing", tool: "refund"}
			got := showCounters(t, o)
			if d := got["daily_refunds"]; len(got) != 2 || d.Used != 350 || d.Limit != 500 || d.Window != "24h" || d.Kind != "budget" ||
				d.FreesAt.IsZero() || got["billing_calls"].Used != 2 || got["billing_calls"].Limit != 100 {
				t.Fatalf("budgets show after two refunds: %+v", got)
			}
			var stdout bytes.Buffer
			if err := budgetsShow(o, &stdout); err != nil || !strings.Contains(stdout.String(), "daily_refunds") ||
				!strings.Contains(stdout.String(), "RESETS AT") {
				t.Fatalf("budgets show: %v\n%s", err, stdout.String())
			}

			o.rule, o.by, o.reason = "daily_refunds", "alice@acme.example", "INC-42: the upstream failed both"
			stdout.Reset()
			if err := budgetsReset(o, &stdout); err != nil || !strings.Contains(stdout.String(), "it held 350 of 500 per 24h") {
				t.Fatalf("budgets reset: %v\n%s", err, stdout.String())
			}
			o.rule = ""
			if got := showCounters(t, o); got["daily_refunds"].Used != 0 || !got["daily_refunds"].ResetsAt.IsZero() || got["billing_calls"].Used != 2 {
				t.Fatalf("budgets show after the reset: %+v", got)
			}
			if r := decideCall(t, svc, supportRefund, refundCall(500)); r != "" {
				t.Fatalf("the whole budget after the reset: %s", r)
			}
			trail, err := os.ReadFile(svc.cfg.Audit.Path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(trail, []byte(`"event":"counter_reset"`)) || !bytes.Contains(trail, []byte(`"by":"alice@acme.example"`)) {
				t.Errorf("the audit trail lacks the reset:\n%s", trail)
			}
		})
	}
}

// What budgets refuses, and with which exit code, against the admin
// listener over testdata/ok.yaml's policy, which has no budgets.
func TestBudgetsCommandRefusals(t *testing.T) {
	admin := strings.TrimPrefix(newAdminRig(t, "").url, "http://")
	call := []string{"--admin", admin, "--principal", supportRefund, "--server", "billing", "--tool", "refund"}
	for _, tt := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"show without a tool", []string{"show", "--admin", admin, "--principal", supportRefund, "--server", "billing"}, exitUsage, "--principal, --server and --tool are required"},
		{"reset without a reason", append([]string{"reset", "--rule", "daily_refunds", "--by", "alice"}, call...), exitUsage, "--rule, --by and --reason are required"},
		{"reset of a rule that counts nothing here", append([]string{"reset", "--rule", "daily_refunds", "--by", "alice", "--reason", "x"}, call...), exitFailure,
			`budgets reset not_found: no such counter: no budget or rate limit "daily_refunds"`},
		{"a reason the API refuses", append([]string{"reset", "--rule", "daily_refunds", "--by", "alice", "--reason", "a\nb"}, call...), exitFailure, "budgets reset bad_request: reason holds a control character"},
		{"a principal the policy does not know", []string{"show", "--admin", admin, "--principal", "spiffe://acme/other", "--server", "billing", "--tool", "refund"}, exitFailure, "budgets show not_found"},
		{"an unknown subcommand", []string{"clear"}, exitUsage, `unknown subcommand "clear"`},
		{"show, where nothing counts", append([]string{"show"}, call...), exitOK, "no budget or rate limit counts spiffe://acme/agent/support-refund's calls of billing/refund"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"budgets"}, tt.args...), &stdout, &stderr)
			if code != tt.code || !strings.Contains(stdout.String()+stderr.String(), tt.want) {
				t.Fatalf("exit %d, want %d; output %q%q, want %q", code, tt.code, &stdout, &stderr, tt.want)
			}
		})
	}
}

// secretFile is a file holding a Redis store's secret.
func secretFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "snapshot.key")
	if err := os.WriteFile(path, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
