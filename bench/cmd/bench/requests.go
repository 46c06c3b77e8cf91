package main

import (
	"context"
	"fmt"
	"strconv"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
)

// The agent, server and calls of every case: examples/demo/policy.yaml's
// support agent refunding within its cap, after looking the order up.
const (
	agent      = "spiffe://acme/agent/support-refund"
	serverID   = "billing"
	epochKey   = "x-capsnap-epoch"
	listBody   = `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`
	lookupBody = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"lookup_order","arguments":{"order_id":"A-100"}}}`
	refundBody = `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"refund","arguments":{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}}}`
	// overCap must be denied by capsnap and OPA alike.
	overCap = `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"refund","arguments":{"order_id":"A-100","amount":300,"reason_code":"duplicate_charge"}}}`
)

// mustDeny checks that a server denies what the policy forbids: a refund
// over the cap, and the allowed refund under an epoch no snapshot has.
// A server that allowed everything would otherwise pass for fast.
func mustDeny(ctx context.Context, c authv3.AuthorizationClient, epoch string) error {
	for what, req := range map[string]*authv3.CheckRequest{
		"a refund over the cap": checkRequest(overCap, epoch),
		"an unknown epoch":      checkRequest(refundBody, "ep_unknown"),
	} {
		resp, err := c.Check(ctx, req)
		if err != nil {
			return fmt.Errorf("failed on %s: %w", what, err)
		}
		if allowed(resp) == nil {
			return fmt.Errorf("allowed %s", what)
		}
	}
	return nil
}

// checkRequest is the CheckRequest Envoy sends for an MCP POST of body
// under envoy/demo.yaml (the body packed as bytes, the route's server_id)
// with an mTLS peer's principal, naming epoch if it is not "".
func checkRequest(body, epoch string) *authv3.CheckRequest {
	headers := map[string]string{
		":method": "POST", ":path": "/mcp", ":authority": "127.0.0.1",
		"content-type":   "application/json",
		"content-length": strconv.Itoa(len(body)),
		"accept":         "application/json, text/event-stream",
		"x-request-id":   "bench",
	}
	if epoch != "" {
		headers[epochKey] = epoch
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Principal: agent},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Id: "bench", Method: "POST", Path: "/mcp", Host: "127.0.0.1", Protocol: "HTTP/1.1",
			Headers: headers, RawBody: []byte(body),
		}},
		ContextExtensions: map[string]string{"server_id": serverID},
	}}
}

// allowed is nil if resp lets the request through, else says why not.
// As for Envoy, that is status OK and no denied response; an OK response
// is optional (OPA-Envoy's boolean decision sends none).
func allowed(resp *authv3.CheckResponse) error {
	if resp.GetStatus() != nil && resp.GetStatus().GetCode() == 0 && resp.GetDeniedResponse() == nil {
		return nil
	}
	return fmt.Errorf("denied (status %d, reason %q): %s", resp.GetStatus().GetCode(), denialReason(resp), resp.GetDeniedResponse().GetBody())
}

// denialReason is the x-capsnap-reason of a denied Check ("" if allowed).
func denialReason(resp *authv3.CheckResponse) string {
	for _, h := range resp.GetDeniedResponse().GetHeaders() {
		if h.GetHeader().GetKey() == "x-capsnap-reason" {
			return h.GetHeader().GetValue()
		}
	}
	return ""
}

// mint lists tools as the agent, which makes capsnap mint a snapshot, and
// calls lookup_order under it, as refund's sequence rule wants; it
// returns the snapshot's epoch.
func mint(ctx context.Context, c authv3.AuthorizationClient) (string, error) {
	resp, err := c.Check(ctx, checkRequest(listBody, ""))
	if err != nil {
		return "", fmt.Errorf("tools/list: %w", err)
	}
	if err := allowed(resp); err != nil {
		return "", fmt.Errorf("tools/list: %w", err)
	}
	epoch := ""
	for _, h := range resp.GetOkResponse().GetResponseHeadersToAdd() {
		if h.GetHeader().GetKey() == epochKey {
			epoch = h.GetHeader().GetValue()
		}
	}
	if epoch == "" {
		return "", fmt.Errorf("tools/list: capsnap returned no %s", epochKey)
	}
	if resp, err = c.Check(ctx, checkRequest(lookupBody, epoch)); err != nil {
		return "", fmt.Errorf("lookup_order: %w", err)
	}
	if err := allowed(resp); err != nil {
		return "", fmt.Errorf("lookup_order: %w", err)
	}
	return epoch, nil
}
