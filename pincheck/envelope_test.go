package pincheck_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/pincheck"
)

// A Guard with a Verifier runs the handler for the call capsnap's envelope
// is about, and refuses, before the handler starts, every other: forged
// headers without an envelope, another call's envelope, an expired one,
// one signed by a key not in the JWKS, one for another server, and one
// whose schema digest is not the handler's.
func TestGuardChecksTheEnvelope(t *testing.T) {
	keyA, err := envelope.LoadKeys(filepath.Join("..", "envelope", "testdata", "key-a.pem"))
	if err != nil {
		t.Fatal(err)
	}
	keyB, err := envelope.LoadKeys(filepath.Join("..", "envelope", "testdata", "key-b.pem"))
	if err != nil {
		t.Fatal(err)
	}
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(jwks, keyA.JWKS(), 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_900_000_000, 0)
	def := refundDef()
	own := mustDigest(t, def)
	args := json.RawMessage(`{"order_id":"A-1","amount":5}`)
	argsDigest, _ := envelope.ArgsDigest(args)
	seal := func(k *envelope.Keys, edit func(*envelope.Claims)) string {
		c := &envelope.Claims{Audience: "billing", Subject: "agent", IssuedAt: now.Unix(), Expiry: now.Add(30 * time.Second).Unix(),
			Epoch: "ep_1", Tool: "refund", SchemaDigest: own, EffectClass: "money_move", PolicyDigest: "sha256:p", ArgsDigest: argsDigest}
		if edit != nil {
			edit(c)
		}
		token, err := k.Seal(c)
		if err != nil {
			t.Fatal(err)
		}
		return token
	}
	recipient, err := envelope.LoadRecipient(filepath.Join("..", "envelope", "testdata", "grant-key-a.pub.pem"))
	if err != nil {
		t.Fatal(err)
	}
	// under seals the call's envelope under a grant of key k.
	under := func(k *envelope.Keys, schemaDigest string) http.Header {
		g, err := k.Grant(envelope.GrantClaims{Audience: "billing", Subject: "agent", IssuedAt: now.Unix(), Expiry: now.Add(5 * time.Minute).Unix(),
			Epoch: "ep_1", Tool: "refund", SchemaDigest: schemaDigest, EffectClass: "money_move", PolicyDigest: "sha256:p"}, recipient)
		if err != nil {
			t.Fatal(err)
		}
		token, err := g.Seal(&envelope.CallClaims{IssuedAt: now.Unix(), Expiry: now.Add(30 * time.Second).Unix(), ArgsDigest: argsDigest})
		if err != nil {
			t.Fatal(err)
		}
		return http.Header{"X-Capsnap-Envelope": {token}, "X-Capsnap-Grant": {g.Token}}
	}
	tests := []struct {
		name    string
		header  http.Header
		args    json.RawMessage
		at      time.Time
		want    string // data.reason; "" runs the handler
		handler int
	}{
		{"the envelope of this call", http.Header{"X-Capsnap-Envelope": {seal(keyA, nil)}}, args, now, "", 1},
		{"forged pin headers, no envelope", http.Header{pincheck.HeaderSchemaDigest: {own}, pincheck.HeaderEpoch: {"ep_1"}}, args, now, string(envelope.Missing), 0},
		{"the envelope with other arguments", http.Header{"X-Capsnap-Envelope": {seal(keyA, nil)}}, json.RawMessage(`{"order_id":"A-1","amount":500}`), now, string(envelope.Mismatch), 0},
		{"expired", http.Header{"X-Capsnap-Envelope": {seal(keyA, nil)}}, args, now.Add(time.Minute), string(envelope.Expired), 0},
		{"signed by an unknown key", http.Header{"X-Capsnap-Envelope": {seal(keyB, nil)}}, args, now, string(envelope.Invalid), 0},
		{"for another server", http.Header{"X-Capsnap-Envelope": {seal(keyA, func(c *envelope.Claims) { c.Audience = "payments" })}}, args, now, string(envelope.Foreign), 0},
		{"another definition pinned", http.Header{"X-Capsnap-Envelope": {seal(keyA, func(c *envelope.Claims) { c.SchemaDigest = "sha256:other" })}}, args, now, pincheck.Reason, 0},
		{"under a grant", under(keyA, own), args, now, "", 1},
		{"under a grant, with other arguments", under(keyA, own), json.RawMessage(`{"order_id":"A-1","amount":500}`), now, string(envelope.Mismatch), 0},
		{"under a grant, expired", under(keyA, own), args, now.Add(time.Minute), string(envelope.Expired), 0},
		{"under a grant signed by an unknown key", under(keyB, own), args, now, string(envelope.Invalid), 0},
		{"under a grant pinning another definition", under(keyA, "sha256:other"), args, now, pincheck.Reason, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := envelope.NewVerifier(envelope.VerifierOptions{Audience: "billing", JWKSFile: jwks, Now: func() time.Time { return tt.at },
				GrantKeyFiles: []string{filepath.Join("..", "envelope", "testdata", "grant-key-a.pem")}})
			if err != nil {
				t.Fatal(err)
			}
			started := 0
			h, err := pincheck.NewGuard(v).Wrap(def, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				started++
				return &mcp.CallToolResult{}, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			_, err = h(context.Background(), &mcp.CallToolRequest{
				Params: &mcp.CallToolParamsRaw{Name: "refund", Arguments: tt.args},
				Extra:  &mcp.RequestExtra{Header: tt.header},
			})
			if started != tt.handler {
				t.Fatalf("the handler started %d times, want %d (%v)", started, tt.handler, err)
			}
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var werr *jsonrpc.Error
			var data struct {
				Reason string `json:"reason"`
			}
			if !errors.As(err, &werr) || werr.Code != pincheck.CodeRefused || json.Unmarshal(werr.Data, &data) != nil || data.Reason != tt.want {
				t.Fatalf("refusal %v, want code %d reason %s", err, pincheck.CodeRefused, tt.want)
			}
		})
	}
}
