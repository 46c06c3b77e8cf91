package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/capsnap/capsnap/bench/grpcload"
	"github.com/capsnap/capsnap/bench/proc"
	"github.com/capsnap/capsnap/bench/report"
	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/testbed"
)

// Concurrencies of the Check over gRPC.
var concurrencies = []int{1, 16, 64}

// Load run sizes: a fixed warm-up, and measured runs sized from its rate,
// within these bounds.
const (
	warmupRequests = 2000
	minRequests    = 1000
	maxRequests    = 500_000
)

// grpcTarget is one server under load.
type grpcTarget struct {
	name   string
	addr   string
	proc   *server
	client authv3.AuthorizationClient
	// pprofURL, if set, serves the target's net/http/pprof.
	pprofURL string
	// capsnap is set for capsnap, whose metrics then prove that it
	// allowed every request of a run.
	capsnap *capsnapServer
	// req is the request the target is sent, and data the file the load
	// reads it from: a capsnap that mints its own snapshot has its own,
	// whose epoch it names.
	req  *authv3.CheckRequest
	data string
}

// checkOverGRPC loads capsnap, the floor, OPA-Envoy and two more capsnaps
// that send the envelope of every allowed call, signed whole and under a
// grant, with the same allowed refund CheckRequest at every concurrency
// (the envelope capsnaps' under their own snapshots), the servers taking
// turns at each so that a noisy spell hits them alike.
func (h *harness) checkOverGRPC(ctx context.Context) error {
	m := &h.results.Method
	m.Concurrencies, m.GRPCRun, m.GRPCWarmup, m.ProfileWindow, m.RequestBody = concurrencies, h.o.grpcRun, warmupRequests, profileWindow, refundBody

	_, billingURL, err := h.startBilling(ctx, "billing-grpc", true)
	if err != nil {
		return err
	}
	capsnap, epoch, err := h.capsnapTarget(ctx, billingURL, report.Capsnap)
	if err != nil {
		return err
	}
	// The floor and OPA are sent capsnap's request, the refund under the
	// snapshot it minted, which OPA's data names too.
	floor, err := h.floorTarget(ctx, capsnap)
	if err != nil {
		return err
	}
	opa, err := h.opaTarget(ctx, capsnap, epoch)
	if err != nil {
		return err
	}
	targets := []grpcTarget{capsnap, floor, opa}
	for _, form := range []string{report.CapsnapEnvelope, report.CapsnapGrant} {
		t, _, err := h.capsnapTarget(ctx, billingURL, form)
		if err != nil {
			return err
		}
		targets = append(targets, t)
	}
	for _, c := range concurrencies {
		runs, err := h.concurrency(ctx, targets, c)
		if err != nil {
			return fmt.Errorf("concurrency %d: %w", c, err)
		}
		for _, run := range runs {
			h.results.GRPC = append(h.results.GRPC, run)
			h.logf("   %-13s c=%-3d %8.0f Checks/s  p50 %-9s p99 %-9s CPU/Check %s, the load's %s", run.Server, c, run.RPS,
				report.Dur(run.P50), report.Dur(run.P99), report.Dur(run.CPUPerCheck), report.Dur(run.ClientPerCheck()))
		}
	}
	// Alone, and at the heaviest load: where the two targets on CPU per
	// Check are judged.
	for _, c := range []int{concurrencies[0], concurrencies[len(concurrencies)-1]} {
		h.logf("   profiling capsnap and the floor at c=%d", c)
		profile, parts, err := h.liveProfile(ctx, targets, c)
		if err != nil {
			return err
		}
		h.results.Live = append(h.results.Live, report.LiveProfile{Concurrency: c, Profile: profile, CPUBreakdown: parts})
	}
	return nil
}

// capsnapTargets are capsnap's process and request file in each form.
var capsnapTargets = map[string]struct{ name, file string }{
	report.Capsnap:         {"capsnap-grpc", "check-request.json"},
	report.CapsnapEnvelope: {"capsnap-grpc-envelope", "check-request-envelope.json"},
	report.CapsnapGrant:    {"capsnap-grpc-grant", "check-request-grant.json"},
}

// capsnapTarget starts capsnap as server (report.Capsnap, or one of the
// envelope's forms), mints a snapshot with its first Check (tools/list),
// checks that it denies what the policy forbids, and writes its request,
// the refund under that snapshot. With an envelope, capsnap signs the
// envelope of every allowed call with a key written for it; under a
// grant, billing has a grant key written for it too; the refund's answer
// must carry them, and their sizes are recorded.
func (h *harness) capsnapTarget(ctx context.Context, billingURL, server string) (grpcTarget, string, error) {
	// The load talks to capsnap directly, with no Envoy and so no response
	// path: the snapshot the Checks name is minted at the tools/list
	// Check, from capsnap's view of the catalog.
	form := capsnapTargets[server]
	spec := capsnapSpec{name: form.name, billingURL: billingURL, principal: "{source: mtls}", extra: "discovery: {bind: catalog}\n"}
	if server != report.Capsnap {
		key := filepath.Join(h.work, spec.name+"-envelope-key.pem")
		if err := testbed.WriteEnvelopeKey(key); err != nil {
			return grpcTarget{}, "", err
		}
		spec.extra += fmt.Sprintf("envelope: {key_files: [%q]}\n", key)
	}
	if server == report.CapsnapGrant {
		key := testbed.GrantKeyFile(h.work, "billing")
		if err := testbed.WriteGrantKey(key); err != nil {
			return grpcTarget{}, "", err
		}
		spec.grantKeyFile = key + ".pub"
	}
	cs, err := h.startCapsnap(ctx, spec)
	if err != nil {
		return grpcTarget{}, "", err
	}
	client, err := h.dialCheck(ctx, cs.grpcAddr, checkRequest(listBody, ""), cs.server)
	if err != nil {
		return grpcTarget{}, "", err
	}
	epoch, err := mint(ctx, client)
	if err == nil {
		err = mustDeny(ctx, client, epoch)
	}
	t := grpcTarget{name: server, addr: cs.grpcAddr, proc: cs.server, client: client, capsnap: cs, req: checkRequest(refundBody, epoch)}
	if err == nil && server != report.Capsnap {
		err = h.envelopeHeaders(ctx, t)
	}
	if err == nil {
		t.data, err = writeRequest(form.file, t.req)
	}
	if err != nil {
		return t, "", fmt.Errorf("%s: %w", server, err)
	}
	if server == report.Capsnap {
		// The live profile is capsnap's and the floor's.
		t.pprofURL = cs.adminURL
	}
	return t, epoch, nil
}

// envelopeHeaders checks that t's allowed refund carries an envelope, and
// a grant if t is under one, and records their sizes.
func (h *harness) envelopeHeaders(ctx context.Context, t grpcTarget) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := t.client.Check(ctx, t.req)
	if err == nil {
		err = allowed(resp)
	}
	if err != nil {
		return fmt.Errorf("the refund: %w", err)
	}
	sizes := map[string]int{}
	for _, hv := range resp.GetOkResponse().GetHeaders() {
		sizes[hv.GetHeader().GetKey()] = len(hv.GetHeader().GetValue())
	}
	n, g := sizes[envelope.Header], sizes[envelope.GrantHeader]
	if n == 0 {
		return fmt.Errorf("an allowed Check carries no %s header", envelope.Header)
	}
	if granted := t.name == report.CapsnapGrant; granted != (g > 0) {
		return fmt.Errorf("an allowed Check carries a %s header of %d bytes", envelope.GrantHeader, g)
	}
	if t.name == report.CapsnapGrant {
		h.results.GrantEnvelopeHeaderBytes, h.results.GrantHeaderBytes = n, g
	} else {
		h.results.EnvelopeHeaderBytes = n
	}
	return nil
}

// floorTarget starts the do-nothing server, sent capsnap's request.
func (h *harness) floorTarget(ctx context.Context, capsnap grpcTarget) (grpcTarget, error) {
	noop, addr, pprofURL, err := h.startNoop("noop-grpc")
	if err != nil {
		return grpcTarget{}, err
	}
	client, err := h.dialCheck(ctx, addr, capsnap.req, noop)
	return grpcTarget{name: report.Floor, addr: addr, proc: noop, client: client, pprofURL: pprofURL, req: capsnap.req, data: capsnap.data}, err
}

// opaTarget starts OPA-Envoy with its data's snapshot under epoch, sent
// capsnap's request, and checks that it allows it and denies what the
// policy forbids.
func (h *harness) opaTarget(ctx context.Context, capsnap grpcTarget, epoch string) (grpcTarget, error) {
	p, addr, err := h.startOPA(ctx, epoch)
	if err != nil {
		return grpcTarget{}, err
	}
	client, err := h.dialCheck(ctx, addr, capsnap.req, p)
	if err != nil {
		return grpcTarget{}, fmt.Errorf("OPA-Envoy does not allow the benchmark's request: %w", err)
	}
	if err := mustDeny(ctx, client, epoch); err != nil {
		return grpcTarget{}, fmt.Errorf("OPA-Envoy: %w", err)
	}
	return grpcTarget{name: report.OPA, addr: addr, proc: p, client: client, req: capsnap.req, data: capsnap.data}, nil
}

// writeRequest writes req as protojson, as the load reads it, to file in
// the out directory, and returns its path.
func writeRequest(file string, req *authv3.CheckRequest) (string, error) {
	b, err := protojson.Marshal(req)
	if err != nil {
		return "", err
	}
	return outPath(file), os.WriteFile(outPath(file), b, 0o644)
}

// concurrency measures every target at concurrency c. Each is first
// checked from Go (the Check must be allowed) and warmed up, and its run
// sized from its warm-up rate to take about grpcRun; then the targets
// take turns (turnOrder), each turn a share of a target's run, so that a
// machine that gets busier or quieter weighs on every server alike.
func (h *harness) concurrency(ctx context.Context, targets []grpcTarget, c int) ([]report.GRPCRun, error) {
	each := make([]int, len(targets))
	tallies := make([]*cpuTally, len(targets))
	for i, t := range targets {
		n, err := h.warmUp(ctx, t, c, h.o.grpcRun)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.name, err)
		}
		each[i], tallies[i] = n/turns, newCPUTally(process{t.name, []int{t.proc.Pid()}})
	}
	reports, err := takeTurns(tallies, func(i int) (grpcload.Report, int, error) {
		t := targets[i]
		if err := t.proc.gone(); err != nil {
			return grpcload.Report{}, 0, err
		}
		// capsnap's metrics must show that it allowed every request.
		var rep grpcload.Report
		var capsnaps []*capsnapServer
		if t.capsnap != nil {
			capsnaps = append(capsnaps, t.capsnap)
		}
		allowed, err := decided(ctx, capsnaps, func() (err error) { rep, err = h.loadRun(t, c, each[i]).Do(ctx); return err })
		if err == nil && t.capsnap != nil && allowed[0] != float64(rep.Count) {
			err = fmt.Errorf("capsnap allowed %.0f requests during a run of %d", allowed[0], rep.Count)
		}
		if err != nil {
			err = fmt.Errorf("%s: %w", t.name, err)
		}
		return rep, rep.Count, err
	})
	if err != nil {
		return nil, err
	}
	runs := make([]report.GRPCRun, len(targets))
	for i, t := range targets {
		cpu := tallies[i].perCall()[0]
		runs[i] = report.GRPCRun{Server: t.name, Concurrency: c, Report: grpcload.Merge(reports[i]...), CPU: cpu.CPU, CPUPerCheck: cpu.PerCall}
		// The floor and OPA decide the same request the same way every
		// time: allowed before and after the run, allowed throughout.
		if err := checkOnce(ctx, t.client, t.req); err != nil {
			return nil, fmt.Errorf("%s: the Check after the run: %w", t.name, err)
		}
		if runs[i].Memory, err = proc.ReadMemory(t.proc.Pid()); err != nil {
			return nil, err
		}
	}
	return runs, nil
}

// warmUp checks that t allows its request, runs a discarded warm-up, and
// returns how many requests a run of about d is at its rate.
func (h *harness) warmUp(ctx context.Context, t grpcTarget, c int, d time.Duration) (int, error) {
	if err := checkOnce(ctx, t.client, t.req); err != nil {
		return 0, fmt.Errorf("the Check before the run: %w", err)
	}
	warm, err := h.loadRun(t, c, warmupRequests).Do(ctx)
	if err != nil {
		return 0, fmt.Errorf("warm-up: %w", err)
	}
	return min(max(int(warm.RPS*d.Seconds()), minRequests), maxRequests), nil
}

// loadRun is a run of n requests against t. The deadline is generous: a
// turn is sized to take 1/turns of grpcRun at the warm-up's rate, and a
// noisy machine may halve that rate.
func (h *harness) loadRun(t grpcTarget, c int, n int) grpcload.Run {
	return grpcload.Run{Bin: h.checkload, Data: t.data, Target: t.addr, Concurrency: c,
		Total: n, Deadline: max(4*h.o.grpcRun, 30*time.Second)}
}

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
