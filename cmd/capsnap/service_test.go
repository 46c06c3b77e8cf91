package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/extauthz"
	"github.com/capsnap/capsnap/lockfile"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/testbed"
)

// The running service, built in process from a configuration as serve
// builds it (on port 0): its health turns SERVING once the catalog is
// read, it decides a Check through the gRPC server Envoy calls, /readyz
// answers, every decision is on the audit trail, and it shuts down when
// its context ends.
func TestServiceInProcess(t *testing.T) {
	cfg, err := config.Load("testdata/ok.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.GRPCAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Audit.Path = filepath.Join(t.TempDir(), "audit.jsonl")
	// The least max_age: a catalog file's list must stay fresh past it.
	cfg.Catalog.MaxAge = time.Second
	stderr := &testbed.SyncBuffer{}
	svc, err := newService(cfg, io.Discard, stderr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- svc.run(ctx) }()
	stop := func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(shutdownGrace + 5*time.Second):
			t.Error("run did not return once its context ended")
		}
		svc.close()
	}
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()

	conn, err := grpc.NewClient(svc.grpcLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: authv3.Authorization_ServiceDesc.ServiceName})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not SERVING after 10s: %v %v\n%s", resp, err, stderr)
		}
	}

	// No verified principal: denied, as the decision core denies it.
	resp, err := authv3.NewAuthorizationClient(conn).Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/mcp",
			Headers: map[string]string{":method": "POST", ":path": "/mcp", "content-type": "application/json", "accept": "application/json, text/event-stream"},
			RawBody: []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`),
		}},
		ContextExtensions: map[string]string{extauthz.ServerIDKey: "billing"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if denied := resp.GetDeniedResponse(); denied == nil || !strings.Contains(string(denied.GetBody()), "no_principal") {
		t.Fatalf("Check answered %v, want a no_principal denial", resp)
	}

	// Ready, and still ready well past max_age: the catalog file is
	// reread, not read once and left to age.
	for end := time.Now().Add(5 * cfg.Catalog.MaxAge / 2); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		r, err := http.Get("http://" + svc.adminLis.Addr().String() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusOK {
			t.Fatalf("/readyz: %s: %s", r.Status, body)
		}
	}

	stop()
	stopped = true
	trail, err := os.ReadFile(cfg.Audit.Path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(trail, []byte(`"reason":"no_principal"`)) || !bytes.Contains(trail, []byte("checkpoint")) {
		t.Fatalf("the audit trail lacks the denial or its closing checkpoint:\n%s", trail)
	}
}

// capsnap lock --approved writes the lockfile from what the running
// capsnap's change control approved: here what billing's catalog file
// listed when capsnap first saw it (first_sight approve).
func TestLockApproved(t *testing.T) {
	cfg, err := config.Load("testdata/changes-off.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokens := filepath.Join(dir, "approvers.yaml")
	if err := os.WriteFile(tokens, []byte("tokens:\n  - {token: t0k3n-0f-the-0n-call-appr0ver, approver: oncall@acme.example, groups: [oncall]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.GRPCAddr, cfg.AdminAddr, cfg.Audit.Path = "127.0.0.1:0", "127.0.0.1:0", filepath.Join(dir, "audit.jsonl")
	cfg.Approvals.Addr, cfg.Approvals.Auth.DevTokensFile = "127.0.0.1:0", tokens
	svc, err := newService(cfg, io.Discard, &testbed.SyncBuffer{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- svc.run(ctx) }()
	defer func() {
		cancel()
		<-done
		svc.close()
	}()

	out := filepath.Join(dir, "capsnap.lock")
	var stdout bytes.Buffer
	o := lockOptions{config: "testdata/changes-off.yaml", out: out, approved: true, admin: svc.adminLis.Addr().String(), timeout: 10 * time.Second}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		stdout.Reset()
		err = lock(o, &stdout)
		if err == nil && strings.Contains(stdout.String(), "3 tools") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock --approved: %v\n%s", err, stdout.String())
		}
	}
	got, err := lockfile.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	defs, err := (&catalog.FileSource{Path: "testdata/tools.json"}).Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, def := range defs {
		var tool struct{ Name string }
		if err := json.Unmarshal(def, &tool); err != nil {
			t.Fatal(err)
		}
		digest, _, err := mcpparse.ToolDigest(def)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Approved("billing", tool.Name, digest) {
			t.Errorf("the lockfile does not approve billing/%s at %s", tool.Name, digest)
		}
	}
}
