//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/testbed"
)

// hostileCase mirrors decide's reading of a testdata/hostile file.
type hostileCase struct {
	Name             string            `json:"name"`
	Headers          map[string]string `json:"headers"`
	Body             string            `json:"body"`
	BodyB64          string            `json:"body_b64"`
	Expect           string            `json:"expect"`
	Note             string            `json:"note"`
	Tool             string            `json:"tool"`
	GRPCOnly         string            `json:"grpc_only"`
	EnvoyStatus      int               `json:"envoy_status"`
	HarmlessSDKError bool              `json:"harmless_sdk_error"`
	// EnvoyExpect overrides Expect through Envoy, where Envoy itself
	// changes the request (EnvoyNote says how).
	EnvoyExpect string `json:"envoy_expect"`
	EnvoyNote   string `json:"envoy_note"`
}

// rawSession is an agent that speaks MCP 2025-03-26 by hand through Envoy:
// it initialized, listed tools (so it holds a snapshot epoch), and can now
// send any bytes.
type rawSession struct {
	t       *testing.T
	s       *testbed.Stack
	agent   *testbed.Agent
	session string
}

func (r *rawSession) post(ctx context.Context, headers map[string]string, body []byte) (*http.Response, []byte) {
	r.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.s.MCPURL(), bytes.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := r.agent.HTTPClient().Do(req)
	if err != nil {
		r.t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func openRawSession(ctx context.Context, t *testing.T, s *testbed.Stack) *rawSession {
	t.Helper()
	r := &rawSession{t: t, s: s, agent: testbed.NewAgent(supportAgent)}
	resp, body := r.post(ctx, nil, []byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"hostile","version":"1"}}}`))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("initialize: %s %s", resp.Status, body)
	}
	r.session = resp.Header.Get("Mcp-Session-Id")
	if r.session == "" {
		t.Fatal("initialize returned no Mcp-Session-Id")
	}
	h := map[string]string{"Mcp-Session-Id": r.session}
	if resp, body := r.post(ctx, h, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); resp.StatusCode/100 != 2 {
		t.Fatalf("notifications/initialized: %s %s", resp.Status, body)
	}
	if resp, body := r.post(ctx, h, []byte(`{"jsonrpc":"2.0","id":"l","method":"tools/list","params":{}}`)); resp.StatusCode != http.StatusOK || r.agent.Epoch() == "" {
		t.Fatalf("tools/list: %s epoch %q %s", resp.Status, r.agent.Epoch(), body)
	}
	return r
}

// TestHostileThroughEnvoy sends every body of the hostile corpus
// (decide/testdata/hostile) with its headers through the real Envoy to
// the real billing server, as an agent that listed tools first and names
// its epoch. A denied case must carry the expected x-capsnap-reason (or be
// refused by Envoy itself where the case says so) and never start a
// handler; an allowed case must start exactly the tool it names (or none,
// where the SDK server answers it with an error).
func TestHostileThroughEnvoy(t *testing.T) {
	files, err := filepath.Glob("../decide/testdata/hostile/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no hostile corpus: %v", err)
	}
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r := openRawSession(ctx, t, s)

	var summary []string
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var c hostileCase
		if err := json.Unmarshal(data, &c); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		t.Run(c.Name, func(t *testing.T) {
			if c.GRPCOnly != "" {
				summary = append(summary, c.Name+": gRPC only ("+c.GRPCOnly+")")
				t.Skip(c.GRPCOnly)
			}
			body := []byte(c.Body)
			if c.BodyB64 != "" {
				if body, err = base64.StdEncoding.DecodeString(c.BodyB64); err != nil {
					t.Fatal(err)
				}
			}
			if c.EnvoyExpect != "" {
				c.Expect, c.Note = c.EnvoyExpect, c.EnvoyNote
			}
			h := map[string]string{testbed.EpochHeader: r.agent.Epoch()}
			if c.Headers["mcp-protocol-version"] < "2026-07-28" {
				h["Mcp-Session-Id"] = r.session
			}
			maps.Copy(h, c.Headers)
			before, err := s.ServerStats(ctx, "billing")
			if err != nil {
				t.Fatal(err)
			}
			resp, reply := r.post(ctx, h, body)
			after, err := s.ServerStats(ctx, "billing")
			if err != nil {
				t.Fatal(err)
			}
			reason := resp.Header.Get("x-capsnap-reason")
			moved := !maps.Equal(before.HandlerStarts, after.HandlerStarts)
			got := fmt.Sprintf("%s: HTTP %d, x-capsnap-reason %q, handlers moved %v", c.Name, resp.StatusCode, reason, moved)
			summary = append(summary, got)
			switch {
			case c.EnvoyStatus != 0:
				if resp.StatusCode != c.EnvoyStatus || reason != "" {
					t.Fatalf("%s; want Envoy's own %d", got, c.EnvoyStatus)
				}
			case c.Expect == "allow":
				if reason != "" {
					t.Fatalf("%s; want allowed (%s)\n%s", got, c.Note, reply)
				}
				want := maps.Clone(before.HandlerStarts)
				if want == nil {
					want = map[string]int{}
				}
				if c.Tool != "" && !c.HarmlessSDKError {
					want[c.Tool]++
				}
				if !maps.Equal(after.HandlerStarts, want) && !(len(want) == 0 && len(after.HandlerStarts) == 0) {
					t.Fatalf("%s; handler starts went %v -> %v, want %v\n%s", got, before.HandlerStarts, after.HandlerStarts, want, reply)
				}
				// The SDK server refuses an unknown method (v1.8.0: HTTP 400
				// "JSON RPC not handled"); either way no handler ran.
				if c.HarmlessSDKError && resp.StatusCode < 400 && !strings.Contains(string(reply), `"error"`) {
					t.Fatalf("%s; the SDK server should have refused it: %s", got, reply)
				}
			default:
				if reason != c.Expect {
					t.Fatalf("%s; want %s (%s)\n%s", got, c.Expect, c.Note, reply)
				}
			}
			if c.Expect != "allow" && moved {
				t.Fatalf("%s; a denied case started a handler: %v -> %v", got, before.HandlerStarts, after.HandlerStarts)
			}
		})
	}
	t.Logf("through Envoy:\n%s", strings.Join(summary, "\n"))
}
