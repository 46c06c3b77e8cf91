//go:build e2e

package e2e

// capsnap's envelope checked by the TypeScript and Python verifiers
// (verifiers/ts, verifiers/python), each guarding a real MCP server on that
// SDK (their example servers: McpServer of @modelcontextprotocol/sdk, and
// MCPServer of the mcp package), run as both of the stack's servers behind
// the real Envoy, with capsnap signing envelopes (StackOptions.Envelope),
// whole or under a grant (StackOptions.Grants, each server holding its
// grant key), and the servers fetching capsnap's JWKS from its admin
// listener.
//
// Through Envoy an allowed call is verified and its handler runs; sent
// straight to the server, forged x-capsnap-* headers without an envelope,
// a genuine envelope replayed for other arguments, an expired envelope and
// one signed by a key capsnap does not publish are each refused with their
// reason, and the handler never starts.
//
// The interpreters come from CAPSNAP_E2E_NODE and CAPSNAP_E2E_PYTHON, and
// the verifiers' packages from e2e/clients/install.sh (`make sdk-clients`);
// without them these tests fail, never skip.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/pincheck"
	"github.com/capsnap/capsnap/testbed"
)

// verifierServer is one SDK's guarded example server.
type verifierServer struct {
	name string
	// command runs the server as server id on addr, checking envelopes
	// against the JWKS at jwks, and opening grants with grantKey if set.
	command func(id, addr, jwks, grantKey string) (string, []string)
}

// verifierServers are the TypeScript and Python example servers; a missing
// interpreter or package fails the test.
func verifierServers(t *testing.T) []verifierServer {
	t.Helper()
	node, python := os.Getenv("CAPSNAP_E2E_NODE"), os.Getenv("CAPSNAP_E2E_PYTHON")
	const how = "run `make e2e`, which installs the verifiers' packages (bash e2e/clients/install.sh) and sets CAPSNAP_E2E_NODE and CAPSNAP_E2E_PYTHON; by hand: bash e2e/clients/install.sh && CAPSNAP_E2E_NODE=$(which node) CAPSNAP_E2E_PYTHON=$PWD/bin/sdk-venv/bin/python go test -tags e2e ./e2e/"
	if node == "" || python == "" {
		t.Fatalf("CAPSNAP_E2E_NODE=%q, CAPSNAP_E2E_PYTHON=%q: both must name an interpreter; %s", node, python, how)
	}
	for _, bin := range []string{node, python} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%v; %s", err, how)
		}
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	ts := filepath.Join(root, "verifiers", "ts")
	for _, p := range []string{"jose", "canonicalize", "@modelcontextprotocol/sdk"} {
		if _, err := os.Stat(filepath.Join(ts, "node_modules", p, "package.json")); err != nil {
			t.Fatalf("the TypeScript verifier's %s is not installed (%v); %s", p, err, how)
		}
	}
	if out, err := exec.Command(python, "-c", "import joserfc, rfc8785, mcp").CombinedOutput(); err != nil {
		t.Fatalf("the Python verifier's packages are not importable by %s: %v\n%s%s", python, err, out, how)
	}
	return []verifierServer{
		{"typescript", func(id, addr, jwks, grantKey string) (string, []string) {
			return node, withGrantKey([]string{filepath.Join(ts, "example", "server.mjs"), "--addr", addr, "--server-id", id, "--jwks-url", jwks}, grantKey)
		}},
		{"python", func(id, addr, jwks, grantKey string) (string, []string) {
			return python, withGrantKey([]string{filepath.Join(root, "verifiers", "python", "example", "server.py"), "--addr", addr, "--server-id", id, "--jwks-url", jwks}, grantKey)
		}},
	}
}

func withGrantKey(args []string, grantKey string) []string {
	if grantKey == "" {
		return args
	}
	return append(args, "--grant-key", grantKey)
}

// verifierStack runs the stack with capsnap signing envelopes, under a
// grant if granted, and srv as both of its servers.
func verifierStack(t *testing.T, srv verifierServer, granted bool) *testbed.Stack {
	t.Helper()
	return startStackWith(t, func(o *testbed.StackOptions) {
		o.Envelope, o.Grants = true, granted
		jwks := fmt.Sprintf("http://127.0.0.1:%d/.well-known/jwks.json", o.Ports.Admin)
		dir := o.Dir
		o.ServerCommand = func(id, addr string) (string, []string, []string) {
			grantKey := ""
			if granted {
				grantKey = testbed.GrantKeyFile(dir, id)
			}
			bin, args := srv.command(id, addr, jwks, grantKey)
			return bin, args, nil
		}
	})
}

// verifierStats is what an example server reports of itself.
type verifierStats struct {
	HandlerStarts map[string]int `json:"handler_starts"`
	Refusals      map[string]int `json:"refusals"`
}

func serverStats(t *testing.T, s *testbed.Stack, id string) verifierStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.ServerURL(id)+"/admin/stats", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st verifierStats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("%s stats: %v", id, err)
	}
	return st
}

func TestEnvelopeSDKVerifiers(t *testing.T) {
	for _, srv := range verifierServers(t) {
		for _, mode := range envelopeModes {
			t.Run(srv.name+"/"+mode.name, func(t *testing.T) { testSDKVerifier(t, srv, mode.granted) })
		}
	}
}

func testSDKVerifier(t *testing.T, srv verifierServer, granted bool) {
	s := verifierStack(t, srv, granted)

	// Through Envoy: an allowed call carries capsnap's envelope,
	// which the SDK's verifier checks before the handler runs.
	c := connect(t, s, "billing", supportAgent, "")
	epoch := c.list(t)
	before := starts(t, s, "billing", "refund")
	if r := c.call(t, "refund", refundA100); r != "" {
		t.Fatalf("refund through Envoy: %q", r)
	}
	if got := starts(t, s, "billing", "refund") - before; got != 1 {
		t.Fatalf("refund's handler ran %d times for one allowed call, want once", got)
	}
	if r := c.call(t, "lookup_order", map[string]any{"order_id": "A-100"}); r != "" {
		t.Fatalf("lookup_order through Envoy: %q", r)
	}
	if st := serverStats(t, s, "billing"); len(st.Refusals) != 0 {
		t.Fatalf("the %s verifier refused calls capsnap allowed: %v", srv.name, st.Refusals)
	}

	// Straight to the server, bypassing Envoy.
	d := connectDirect(t, s, "billing")
	tools, err := d.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	own := ""
	for _, tl := range tools.Tools {
		if tl.Name == "refund" {
			if own, err = pincheck.Digest(tl); err != nil {
				t.Fatal(err)
			}
		}
	}
	if own == "" {
		t.Fatalf("the %s server lists no refund tool", srv.name)
	}
	before = starts(t, s, "billing", "refund")

	refuseOffEnvoy(t, s, d, epoch, own, granted)

	if got := starts(t, s, "billing", "refund") - before; got != 0 {
		t.Fatalf("refund's handler ran %d times for requests that bypassed Envoy", got)
	}
	st := serverStats(t, s, "billing")
	for _, r := range []envelope.Reason{envelope.Missing, envelope.Mismatch, envelope.Expired, envelope.Invalid} {
		if st.Refusals[string(r)] < 1 {
			t.Errorf("the %s server counted no %s refusal: %v", srv.name, r, st.Refusals)
		}
	}
	t.Logf("%s: the allowed call ran; refused off Envoy: %v", srv.name, st.Refusals)
}
