package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/capsnap/capsnap/bench/mcpload"
	"github.com/capsnap/capsnap/bench/report"
	"github.com/capsnap/capsnap/testbed"
)

// The response path's case (issue 17): a role granted 12 tools of a
// 225-tool catalog lists them, through Envoy with the response path and
// through the same Envoy without it.
const (
	deliveryCatalog = 225
	deliveryGranted = 12
	deliveryRole    = "spiffe://acme/role/support"
	// Each mode: a discarded warm-up, then this many listings in its
	// turns, each bounded by deliveryTurn too. Two workers: a listing
	// keeps four processes busy (client, Envoy, capsnap, the server), and
	// on a small machine more workers would measure their queue more than
	// the response path.
	deliveryWorkers  = 2
	deliveryWarmup   = 200
	deliveryListings = 2000
	deliveryTurn     = 15 * time.Second
)

// The request: one stateless MCP 2026-07-28 tools/list, its id %d.
const (
	deliveryVersion = "2026-07-28"
	deliveryBody    = `{"jsonrpc":"2.0","id":%d,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
)

// delivery measures what an agent's tools/list delivers, and what it
// costs, with capsnap's response path and without it: mcpfixture serving
// 225 generated tools; a policy that classifies all of them and grants
// deliveryRole 12; two capsnaps on that policy, one binding snapshots to
// what is delivered (the default), one to its catalog; and two Envoys on
// envoy/demo.yaml, identical but that the second has no capsnap.ext_proc
// filter (without which capsnap's default binding would mint nothing).
func (h *harness) delivery(ctx context.Context) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	fixture, err := h.start("mcpfixture", h.mcpfixture, "-addr", addr, "-variant", "bench", "-mode", fmt.Sprintf("json,tools=%d", deliveryCatalog))
	if err != nil {
		return err
	}
	fixtureURL := "http://" + addr
	if err := fixture.awaitHTTP(ctx, fixtureURL+"/admin/stats"); err != nil {
		return err
	}
	// The server's own list, straight from it: the tools the policy
	// classifies, and the bytes it sends.
	upstream := &listingMode{url: fixtureURL + "/mcp"}
	upstream.open(1)
	one, err := upstream.list(ctx, 0)
	if err != nil {
		return fmt.Errorf("tools/list straight from mcpfixture: %w", err)
	}
	if len(one.names) != deliveryCatalog {
		return fmt.Errorf("mcpfixture lists %d tools, want %d", len(one.names), deliveryCatalog)
	}
	policy, granted := deliveryPolicy(one.names)

	d := &h.results.Delivery
	*d = report.Delivery{
		Principal: deliveryRole, CatalogTools: deliveryCatalog, GrantedTools: len(granted), UpstreamBytes: one.bytes,
		Workers: deliveryWorkers, Warmup: deliveryWarmup, Listings: deliveryListings, Turn: deliveryTurn,
	}
	with := &listingMode{name: "with the response path", want: granted}
	without := &listingMode{name: "without the response path", want: one.names}
	modes := []*listingMode{with, without}
	for _, m := range modes {
		spec := capsnapSpec{name: "capsnap-delivered", billingURL: fixtureURL, principal: headerPrincipal, policy: policy}
		envoyName, edit := "envoy-delivered", (func([]byte) ([]byte, error))(nil)
		if m == without {
			// Without the filter, a snapshot can only be minted at the
			// request: from capsnap's own view of the catalog.
			spec.name, spec.extra = "capsnap-catalog", "discovery: {bind: catalog}\n"
			envoyName, edit = "envoy-catalog", func(cfg []byte) ([]byte, error) { return withoutFilter(cfg, extProcFilter) }
		}
		if m.capsnap, err = h.startCapsnap(ctx, spec); err != nil {
			return err
		}
		if m.envoy, m.url, _, err = h.startEnvoy(ctx, envoyName, fixtureURL, []string{m.capsnap.grpcAddr}, edit); err != nil {
			return err
		}
		// What one listing delivers, through each; then a warm-up.
		m.open(deliveryWorkers)
		one, err := m.list(ctx, 0)
		if err == nil {
			_, err = m.measure(ctx, deliveryWarmup, deliveryTurn)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		m.bytes = one.bytes
	}
	d.FilteredBytes, d.UnfilteredBytes = with.bytes, without.bytes
	h.logf("   one tools/list: %d bytes (%d tools) with the response path, %d bytes (%d tools) without: %.1f× fewer",
		with.bytes, len(with.want), without.bytes, len(without.want), float64(without.bytes)/float64(with.bytes))

	// What listings cost: turns A B B A, passes times over, so that a
	// machine that gets busier or quieter during the step weighs on both
	// alike.
	tallies := make([]*cpuTally, len(modes))
	for i, m := range modes {
		tallies[i] = newCPUTally(process{"Envoy", []int{m.envoy.Pid()}}, process{"capsnap", []int{m.capsnap.Pid()}},
			process{"mcpfixture", []int{fixture.Pid()}}, theLoad())
	}
	names, envoys := []string{with.name, without.name}, []*server{with.envoy, without.envoy}
	results, err := callsInTurns(ctx, names, envoys, tallies, []*capsnapServer{with.capsnap, without.capsnap}, func(i int) (mcpload.Sample, error) {
		return modes[i].measure(ctx, deliveryListings/turns, deliveryTurn)
	})
	if err != nil {
		return err
	}
	d.With, d.Without = results[0], results[1]
	d.WithCPU, d.WithoutCPU = tallies[0].perCall(), tallies[1].perCall()
	if d.Profile, err = h.profileListings(ctx, with); err != nil {
		return fmt.Errorf("%s: profile: %w", with.name, err)
	}
	for _, m := range []struct {
		name string
		res  mcpload.Result
	}{{without.name, d.Without}, {with.name, d.With}} {
		h.logf("   %-26s %5d listings %6.0f/s  p50 %-9s p90 %-9s p99 %s", m.name, m.res.Calls, m.res.RPS,
			report.Dur(m.res.P50), report.Dur(m.res.P90), report.Dur(m.res.P99))
	}
	t := report.DeliveryTarget(*d)
	h.logf("   issue 17: %s %s: %s, %s", t.Name, t.Threshold, t.Measured, t.Status)
	return nil
}

// deliveryPolicy classifies every one of tools (a read, every fourth a
// write) and grants deliveryRole deliveryGranted of them, spread evenly
// over the list; it returns the policy and the granted names, sorted.
func deliveryPolicy(tools []string) ([]byte, []string) {
	var b strings.Builder
	b.WriteString("# make bench's response-path case: every tool classified, a role granted a few.\ntools:\n")
	for i, t := range tools {
		effect := "read"
		if i%4 == 3 {
			effect = "write"
		}
		fmt.Fprintf(&b, "  - {server: billing, tool: %s, effect: %s}\n", t, effect)
	}
	var granted []string
	for k := range deliveryGranted {
		granted = append(granted, tools[k*(len(tools)-1)/(deliveryGranted-1)])
	}
	granted = slices.Compact(granted)
	fmt.Fprintf(&b, "principals:\n  - id: %s\n    grants:\n      - {server: billing, tools: [%s]}\n", deliveryRole, strings.Join(granted, ", "))
	slices.Sort(granted)
	return []byte(b.String()), granted
}

// listingMode is one Envoy the listings go through, and its workers'
// connections.
type listingMode struct {
	name string
	// want are the tool names every listing must deliver, sorted, with an
	// epoch; nil for the server's own list.
	want    []string
	url     string
	envoy   *server
	capsnap *capsnapServer
	bytes   int
	workers []*mcpload.Session
	ids     atomic.Int64
}

// open gives each of n workers its own connection.
func (m *listingMode) open(n int) {
	for range n {
		m.workers = append(m.workers, mcpload.Dial(m.url, map[string]string{
			"Mcp-Protocol-Version": deliveryVersion, "Mcp-Method": "tools/list", testbed.PrincipalHeader: deliveryRole,
		}))
	}
}

// measure has the workers list until they made n listings between them
// or d has passed.
func (m *listingMode) measure(ctx context.Context, n int, d time.Duration) (mcpload.Sample, error) {
	var left atomic.Int64
	left.Store(int64(n))
	more := func(int) bool { return left.Add(-1) >= 0 }
	return mcpload.Workers(ctx, len(m.workers), d, more, func(w int) (time.Duration, error) {
		one, err := m.list(ctx, w)
		return one.elapsed, err
	})
}

// listing is what one tools/list came back with.
type listing struct {
	// elapsed is from sending the request to reading the whole body.
	elapsed time.Duration
	bytes   int
	// names are the delivered tools', sorted.
	names []string
}

// list is one listing by worker w, which must come back whole, as JSON,
// and through Envoy with an epoch and exactly m.want.
func (m *listingMode) list(ctx context.Context, w int) (listing, error) {
	start := time.Now()
	r, err := m.workers[w].Post(ctx, fmt.Appendf(nil, deliveryBody, m.ids.Add(1)))
	one := listing{elapsed: time.Since(start), bytes: len(r.Body)}
	if err != nil {
		return one, err
	}
	var msg struct {
		Result struct {
			Tools []struct {
				Name string `json:"name"`
			} `json:"tools"`
			NextCursor string `json:"nextCursor"`
		} `json:"result"`
	}
	switch ct := r.Header.Get("Content-Type"); {
	case !r.OK():
		return one, fmt.Errorf("tools/list: %s", r)
	case !strings.HasPrefix(ct, "application/json"):
		return one, fmt.Errorf("tools/list: content type %q, want application/json (mcpfixture's json mode)", ct)
	case json.Unmarshal(r.Body, &msg) != nil || msg.Result.NextCursor != "":
		return one, fmt.Errorf("tools/list: not one page of tools: %.300s", r.Body)
	}
	for _, t := range msg.Result.Tools {
		one.names = append(one.names, t.Name)
	}
	slices.Sort(one.names)
	if epoch := r.Header.Get(testbed.EpochHeader); m.want != nil && !strings.HasPrefix(epoch, "ep_") {
		return one, fmt.Errorf("tools/list: no %s header (got %q)", testbed.EpochHeader, epoch)
	}
	if m.want != nil && !slices.Equal(one.names, m.want) {
		return one, fmt.Errorf("tools/list: delivered %d tools, want %d: %v", len(one.names), len(m.want), one.names)
	}
	return one, nil
}

// profileListings profiles m's capsnap while the workers list through m
// for about twice the profile window, after the measured turns: where a
// listing's CPU goes in the running server, its transport and audit
// writes included, which BenchmarkDeliver225 does not run.
func (h *harness) profileListings(ctx context.Context, m *listingMode) (*report.Profile, error) {
	file := outPath("live-" + m.capsnap.Name + ".pprof")
	sample, err := profileDuring(ctx, h, m.capsnap.adminURL, file, func() (mcpload.Sample, error) {
		return m.measure(ctx, math.MaxInt, 2*profileWindow)
	})
	if err != nil {
		return nil, err
	}
	args := []string{"-top", "-cum", "-nodecount", "40", file}
	top, err := h.pprof(ctx, args...)
	if err != nil {
		return nil, err
	}
	rate := float64(len(sample.Latencies)) / sample.Elapsed.Seconds()
	return &report.Profile{
		What: fmt.Sprintf("CPU profile of the running capsnap (%s), %v while %d workers listed through the response path at %.0f listings/s, after the measured turns; its top 40 functions by cumulative time. "+
			"Divide a function's time by the rate and the window for its cost per listing.", m.capsnap.Name, profileWindow, len(m.workers), rate),
		Command: "go tool pprof " + strings.Join(args, " "),
		Top:     top,
	}, nil
}
