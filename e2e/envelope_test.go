//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/pincheck"
	"github.com/capsnap/capsnap/testbed"
)

func envelopeStack(t *testing.T, granted bool) *testbed.Stack {
	t.Helper()
	return startStackWith(t, func(o *testbed.StackOptions) { o.Envelope, o.Grants = true, granted })
}

// envelopeModes are the two forms of the envelope (docs/ENVELOPE.md):
// signed whole per call, and under a grant, for servers with a grant key.
var envelopeModes = []struct {
	name    string
	granted bool
}{{"signed whole", false}, {"under a grant", true}}

// An allowed call through Envoy carries capsnap's envelope, which pincheck
// on the Go SDK billing server verifies before the handler runs; the
// audit line of the call names the envelope, and its grant if under one.
func TestEnvelopeThroughEnvoy(t *testing.T) {
	for _, mode := range envelopeModes {
		t.Run(mode.name, func(t *testing.T) {
			s := envelopeStack(t, mode.granted)
			c := connect(t, s, "billing", supportAgent, "")
			c.list(t)
			before := starts(t, s, "billing", "refund")
			for range 2 {
				if r := c.call(t, "refund", refundA100); r != "" {
					t.Fatalf("refund: %q", r)
				}
			}
			if got := starts(t, s, "billing", "refund") - before; got != 2 {
				t.Fatalf("refund handler ran %d times, want twice", got)
			}
			// Both allowed calls' audit lines name their envelope; under a
			// grant, its grant too, and signed whole, none.
			out := s.Capsnap.Output()
			for deadline := time.Now().Add(10 * time.Second); strings.Count(out, `"envelope":"`) < 2; out = s.Capsnap.Output() {
				if time.Now().After(deadline) {
					t.Fatalf("%d audit lines name an envelope, want 2", strings.Count(out, `"envelope":"`))
				}
				time.Sleep(20 * time.Millisecond)
			}
			want := 0
			if mode.granted {
				want = 2
			}
			if grants := strings.Count(out, `"envelope_grant":"`); grants != want {
				t.Fatalf("%d audit lines name a grant, want %d", grants, want)
			}
		})
	}
}

// directSession is an MCP session straight to server id, bypassing Envoy
// and capsnap, whose requests carry whatever headers the test sets.
type directSession struct {
	*mcp.ClientSession
	headers http.Header
}

type headerTransport struct{ h *http.Header }

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, vs := range *t.h {
		r.Header[k] = vs
	}
	return http.DefaultTransport.RoundTrip(r)
}

func connectDirect(t *testing.T, s *testbed.Stack, id string) *directSession {
	t.Helper()
	d := &directSession{headers: http.Header{}}
	client := mcp.NewClient(&mcp.Implementation{Name: "bypass", Version: "1"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: s.ServerURL(id) + "/mcp", HTTPClient: &http.Client{Transport: headerTransport{&d.headers}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	d.ClientSession = cs
	return d
}

// refusal is the data.reason of a call the server refused at handler
// start, or "" if the handler ran.
func (d *directSession) refusal(t *testing.T, tool string, args map[string]any) string {
	t.Helper()
	res, err := d.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err == nil {
		if res.IsError {
			t.Fatalf("%s: tool error %v", tool, res.Content)
		}
		return ""
	}
	var werr *jsonrpc.Error
	var data struct {
		Reason string `json:"reason"`
	}
	if !errors.As(err, &werr) || werr.Code != pincheck.CodeRefused || json.Unmarshal(werr.Data, &data) != nil {
		t.Fatalf("%s: %v is not a handler-start refusal", tool, err)
	}
	return data.Reason
}

// checkDirect asks capsnap for a Check as Envoy would, and returns the
// envelope of the allowed call, and its grant if any: one genuine
// envelope, for the test to replay.
func checkDirect(t *testing.T, s *testbed.Stack, epoch, body string) envelope.Presented {
	t.Helper()
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := authv3.NewAuthorizationClient(conn).Check(context.Background(), &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/billing/mcp",
			Headers: map[string]string{
				"content-type": "application/json", "accept": "application/json, text/event-stream",
				"x-capsnap-dev-principal": supportAgent, testbed.EpochHeader: epoch,
			},
			RawBody: []byte(body),
		}},
		ContextExtensions: map[string]string{"server_id": "billing"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var p envelope.Presented
	for _, h := range resp.GetOkResponse().GetHeaders() {
		switch h.GetHeader().GetKey() {
		case envelope.Header:
			p.Envelope = h.GetHeader().GetValue()
		case envelope.GrantHeader:
			p.Grant = h.GetHeader().GetValue()
		}
	}
	if p.Envelope == "" {
		t.Fatalf("Check allowed no envelope: %v", resp)
	}
	return p
}

// Requests sent straight to the billing server, bypassing Envoy, are
// refused before the handler runs: forged x-capsnap-* headers without an
// envelope, a genuine envelope replayed for other arguments, an expired
// envelope and one signed by a key capsnap does not publish.
func TestEnvelopeRefusedOffEnvoy(t *testing.T) {
	for _, mode := range envelopeModes {
		t.Run(mode.name, func(t *testing.T) {
			s := envelopeStack(t, mode.granted)
			c := connect(t, s, "billing", supportAgent, "")
			epoch := c.list(t)
			own := digestOf(t, "baseline", "refund")
			d := connectDirect(t, s, "billing")
			before := starts(t, s, "billing", "refund")

			refuseOffEnvoy(t, s, d, epoch, own, mode.granted)
			if got := starts(t, s, "billing", "refund") - before; got != 0 {
				t.Fatalf("refund's handler ran %d times for requests that bypassed Envoy", got)
			}
		})
	}
}

// refuseOffEnvoy sends d's server, straight, the requests that must be
// refused before its handler runs: forged x-capsnap-* headers without an
// envelope, a genuine envelope replayed for other arguments, an expired
// envelope and one signed by a key capsnap does not publish; under a grant
// if granted (the grant's call key encrypted to the server's grant key,
// which the stack wrote). own is the schema digest of the server's refund.
func refuseOffEnvoy(t *testing.T, s *testbed.Stack, d *directSession, epoch, own string, granted bool) {
	t.Helper()
	d.headers.Set("x-capsnap-schema-digest", own)
	d.headers.Set("x-capsnap-epoch", epoch)
	d.headers.Set("x-capsnap-principal", supportAgent)
	if r := d.refusal(t, "refund", refundA100); r != string(envelope.Missing) {
		t.Errorf("forged headers, no envelope: %q, want %s", r, envelope.Missing)
	}
	present := func(p envelope.Presented) {
		d.headers.Set(envelope.Header, p.Envelope)
		d.headers.Del(envelope.GrantHeader)
		if p.Grant != "" {
			d.headers.Set(envelope.GrantHeader, p.Grant)
		}
	}

	genuine := checkDirect(t, s, epoch, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"refund","arguments":{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}}}`)
	if (genuine.Grant != "") != granted {
		t.Fatalf("capsnap's envelope: grant %q, want one: %t", genuine.Grant, granted)
	}
	present(genuine)
	if r := d.refusal(t, "refund", map[string]any{"order_id": "A-100", "amount": 249, "reason_code": "duplicate_charge"}); r != string(envelope.Mismatch) {
		t.Errorf("a genuine envelope replayed for other arguments: %q, want %s", r, envelope.Mismatch)
	}

	keys, err := envelope.LoadKeys(s.EnvelopeKey())
	if err != nil {
		t.Fatal(err)
	}
	args, _ := envelope.ArgsDigest(json.RawMessage(`{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`))
	seal := func(k *envelope.Keys, iat, exp time.Time) envelope.Presented {
		if !granted {
			token, err := k.Seal(&envelope.Claims{Audience: "billing", Subject: supportAgent, IssuedAt: iat.Unix(), Expiry: exp.Unix(),
				Epoch: epoch, Tool: "refund", SchemaDigest: own, EffectClass: "money_move", PolicyDigest: "sha256:x", ArgsDigest: args})
			if err != nil {
				t.Fatal(err)
			}
			return envelope.Presented{Envelope: token}
		}
		r, err := envelope.LoadRecipient(testbed.GrantKeyFile(s.Dir(), "billing") + ".pub")
		if err != nil {
			t.Fatal(err)
		}
		g, err := k.Grant(envelope.GrantClaims{Audience: "billing", Subject: supportAgent, IssuedAt: iat.Unix(), Expiry: exp.Unix(),
			Epoch: epoch, Tool: "refund", SchemaDigest: own, EffectClass: "money_move", PolicyDigest: "sha256:x"}, r)
		if err != nil {
			t.Fatal(err)
		}
		token, err := g.Seal(&envelope.CallClaims{IssuedAt: iat.Unix(), Expiry: exp.Unix(), ArgsDigest: args})
		if err != nil {
			t.Fatal(err)
		}
		return envelope.Presented{Envelope: token, Grant: g.Token}
	}
	present(seal(keys, time.Now().Add(-2*time.Minute), time.Now().Add(-time.Minute)))
	if r := d.refusal(t, "refund", refundA100); r != string(envelope.Expired) {
		t.Errorf("an expired envelope: %q, want %s", r, envelope.Expired)
	}

	stranger := filepath.Join(t.TempDir(), "stranger.pem")
	if err := testbed.WriteEnvelopeKey(stranger); err != nil {
		t.Fatal(err)
	}
	other, err := envelope.LoadKeys(stranger)
	if err != nil {
		t.Fatal(err)
	}
	present(seal(other, time.Now(), time.Now().Add(30*time.Second)))
	if r := d.refusal(t, "refund", refundA100); r != string(envelope.Invalid) {
		t.Errorf("an envelope signed by an unknown key: %q, want %s", r, envelope.Invalid)
	}
}

// A key rotation: the new key is published, then signs, then the old one
// is retired; every call capsnap allows on the way is accepted by the
// billing server, which fetches capsnap's JWKS when an envelope names a
// key it does not know.
func TestEnvelopeKeyRotation(t *testing.T) {
	s := envelopeStack(t, false)
	old, next := s.EnvelopeKey(), filepath.Join(s.Dir(), "envelope-2.pem")
	if err := testbed.WriteEnvelopeKey(next); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	calls := 0
	for i, keys := range [][]string{{old}, {old, next}, {next, old}, {next}} {
		if i > 0 {
			// A verifier that meets an unknown kid fetches the JWKS again,
			// at most once a second; rotations are minutes apart.
			time.Sleep(1100 * time.Millisecond)
			if err := s.SetEnvelopeKeys(keys...); err != nil {
				t.Fatal(err)
			}
			if err := s.Capsnap.Stop(); err != nil {
				t.Fatal(err)
			}
			if err := s.StartCapsnap(ctx); err != nil {
				t.Fatal(err)
			}
		}
		c := connect(t, s, "billing", supportAgent, "")
		c.list(t)
		before := starts(t, s, "billing", "refund")
		for range 3 {
			if r := c.call(t, "refund", refundA100); r != "" {
				t.Fatalf("step %d (keys %v): refund %q", i, keys, r)
			}
			calls++
		}
		if got := starts(t, s, "billing", "refund") - before; got != 3 {
			t.Fatalf("step %d (keys %v): %d of 3 allowed calls ran", i, keys, got)
		}
	}
	t.Logf("%d allowed calls across the rotation, every one accepted", calls)
}
