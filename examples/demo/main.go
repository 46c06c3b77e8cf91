// Command demo walks a newcomer through capsnap's decisions: it starts the
// billing MCP server, capsnap and a real Envoy on the demo ports, then acts
// as an agent on the official MCP Go SDK and prints each decision and why.
package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/testbed"
)

//go:embed policy.yaml
var policy []byte

const (
	supportAgent  = "spiffe://acme/agent/support-refund"
	readonlyAgent = "spiffe://acme/agent/support-readonly"
)

func main() {
	capsnapBin := flag.String("capsnap", "bin/capsnap", "capsnap binary")
	billingBin := flag.String("billing", "bin/billing", "billing example server binary")
	verbose := flag.Bool("v", false, "also print every process's output")
	flag.Parse()
	if err := run(*capsnapBin, *billingBin, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(capsnapBin, billingBin string, verbose bool) error {
	envoyBin, err := testbed.FindEnvoy()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "capsnap-demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var tee io.Writer
	if verbose {
		tee = os.Stderr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	step("Starting the billing MCP server, capsnap and Envoy on loopback")
	s, err := testbed.StartStack(ctx, testbed.StackOptions{
		Capsnap: capsnapBin, Billing: billingBin, Envoy: envoyBin,
		Ports: testbed.DemoPorts, Dir: dir, Policy: policy, Tee: tee,
	})
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Printf("  Envoy:   %s\n  MCP URL: %s (Envoy -> capsnap ext_authz -> billing)\n", s.EnvoyVersion, s.MCPURL())

	step("The support agent connects and discovers tools (tools/list passes)")
	cs, err := testbed.Connect(ctx, s.MCPURL(), supportAgent, "")
	if err != nil {
		return err
	}
	defer cs.Close()
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		return fmt.Errorf("tools/list: %w", err)
	}
	for _, t := range list.Tools {
		fmt.Printf("  tool %-13s %s\n", t.Name, firstLine(t.Description))
	}

	step("Refund order A-100, USD 40, duplicate_charge")
	call(ctx, cs, "refund", map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"})
	st, err := s.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("  billing's refund handler has started %d time(s)\n", st.HandlerStarts["refund"])

	step("A tool the server does not serve")
	call(ctx, cs, "delete_all_orders", map[string]any{})

	step("The read-only agent tries to refund")
	ro, err := testbed.Connect(ctx, s.MCPURL(), readonlyAgent, "")
	if err != nil {
		return err
	}
	defer ro.Close()
	call(ctx, ro, "refund", map[string]any{"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"})

	step(`A body with "name" twice (a parser differential)`)
	rawPost(ctx, s, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"lookup_order","name":"refund","arguments":{}}}`)

	st, err = s.Stats(ctx)
	if err != nil {
		return err
	}
	step(fmt.Sprintf("Done: the refund handler ran %d time(s); no denied call reached it", st.HandlerStarts["refund"]))
	return nil
}

func step(s string) { fmt.Printf("\n== %s\n", s) }

func call(ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) {
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err == nil {
		fmt.Printf("  ALLOW  tools/call %s\n", tool)
		return
	}
	var werr *jsonrpc.Error
	if !errors.As(err, &werr) {
		fmt.Printf("  ERROR  tools/call %s: %v\n", tool, err)
		return
	}
	var data struct {
		Reason string `json:"reason"`
		Detail string `json:"detail"`
	}
	_ = json.Unmarshal(werr.Data, &data)
	fmt.Printf("  DENY   tools/call %s: %s (%s)\n", tool, data.Reason, data.Detail)
}

func rawPost(ctx context.Context, s *testbed.Stack, body string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.MCPURL(), strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := testbed.HTTPClient(supportAgent).Do(req)
	if err != nil {
		fmt.Printf("  ERROR  %v\n", err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Printf("  DENY   HTTP %d, x-capsnap-reason: %s\n         %s\n", resp.StatusCode, resp.Header.Get("x-capsnap-reason"), b)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
