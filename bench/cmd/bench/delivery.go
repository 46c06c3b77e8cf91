package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
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
	// deliveryTimeout bounds one listing.
	deliveryTimeout = 10 * time.Second
	// deliveryMaxBody bounds what is read of one response: Envoy's own
	// bound on a buffered body (max_request_bytes).
	deliveryMaxBody = 1 << 20
)

// The request: one stateless MCP 2026-07-28 tools/list.
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
	var done cleanups
	defer done.run()
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	fixture, err := h.start("mcpfixture", h.mcpfixture, "-addr", addr, "-variant", "bench", "-mode", fmt.Sprintf("json,tools=%d", deliveryCatalog))
	if err != nil {
		return err
	}
	done.add(func() { h.stop(fixture) })
	fixtureURL := "http://" + addr
	if err := h.waitHTTP(ctx, fixtureURL+"/admin/stats", fixture); err != nil {
		return err
	}
	// The server's own list, straight from it: the tools the policy
	// classifies, and the bytes it sends.
	upstream, err := listOnce(ctx, http.DefaultClient, fixtureURL+"/mcp", 1)
	if err != nil {
		return fmt.Errorf("tools/list straight from mcpfixture: %w", err)
	}
	if len(upstream.names) != deliveryCatalog {
		return fmt.Errorf("mcpfixture lists %d tools, want %d", len(upstream.names), deliveryCatalog)
	}
	policy, granted := deliveryPolicy(upstream.names)

	d := &h.results.Delivery
	*d = report.Delivery{
		Principal: deliveryRole, CatalogTools: deliveryCatalog, GrantedTools: len(granted), UpstreamBytes: upstream.bytes,
		Workers: deliveryWorkers, Warmup: deliveryWarmup, Listings: deliveryListings, Turn: deliveryTurn,
	}
	const principal = "{source: header, insecure_header: true}"
	modes := []*listingMode{
		{name: "with the response path", want: granted},
		{name: "without the response path", want: upstream.names},
	}
	with, without := modes[0], modes[1]
	for _, m := range []struct {
		mode      *listingMode
		capsnap   capsnapSpec
		envoyName string
		editEnvoy func([]byte) ([]byte, error)
	}{
		{with, capsnapSpec{name: "capsnap-delivered", billingURL: fixtureURL, principal: principal, policy: policy}, "envoy-delivered", nil},
		// Without the filter, a snapshot can only be minted at the
		// request: from capsnap's own view of the catalog.
		{without, capsnapSpec{name: "capsnap-catalog", billingURL: fixtureURL, principal: principal, policy: policy,
			extra: "discovery: {bind: catalog}\n"}, "envoy-catalog", withoutExtProc},
	} {
		cs, err := h.startCapsnapWith(ctx, m.capsnap)
		if err != nil {
			return err
		}
		done.add(func() { h.stop(cs.server) })
		envoy, url, err := h.startEnvoyNamed(ctx, m.envoyName, fixtureURL, cs.grpcAddr, m.editEnvoy)
		if envoy != nil {
			done.add(func() { h.stop(envoy) })
		}
		if err != nil {
			return err
		}
		m.mode.url, m.mode.envoy, m.mode.capsnap = url, envoy, cs
	}

	// What one listing delivers, through each.
	for _, m := range modes {
		one, err := m.listOnce(ctx, http.DefaultClient)
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		m.bytes = one.bytes
	}
	d.FilteredBytes, d.UnfilteredBytes = with.bytes, without.bytes
	h.logf("   one tools/list: %d bytes (%d tools) with the response path, %d bytes (%d tools) without: %.1f× fewer",
		with.bytes, len(with.want), without.bytes, len(without.want), float64(without.bytes)/float64(with.bytes))

	// What listings cost: warm up, then turns A B B A, passes times over.
	for _, m := range modes {
		m.open()
		defer m.close()
		if _, err := m.measure(ctx, deliveryWarmup, deliveryTurn); err != nil {
			return fmt.Errorf("%s: warm-up: %w", m.name, err)
		}
	}
	denied := map[*listingMode]float64{}
	for _, m := range modes {
		if _, denied[m], err = m.capsnap.decisions(ctx); err != nil {
			return err
		}
	}
	// A machine that gets busier or quieter during the step weighs on
	// both alike.
	tallies := make([]*cpuTally, len(modes))
	for i, m := range modes {
		tallies[i] = newCPUTally(process{"Envoy", []int{m.envoy.Pid()}}, process{"capsnap", []int{m.capsnap.Pid()}},
			process{"mcpfixture", []int{fixture.Pid()}}, theLoad())
	}
	results, err := takeTurns(tallies, func(i int) (mcpload.Sample, error) {
		s, err := modes[i].measure(ctx, deliveryListings/turns, deliveryTurn)
		if err == nil {
			err = modes[i].envoy.gone()
		}
		if err != nil {
			err = fmt.Errorf("%s: %w", modes[i].name, err)
		}
		return s, err
	})
	if err != nil {
		return err
	}
	for _, m := range modes {
		if _, after, err := m.capsnap.decisions(ctx); err != nil || after != denied[m] {
			return fmt.Errorf("%s: capsnap denied %.0f requests during the runs (%v)", m.name, after-denied[m], err)
		}
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

// profileListings profiles m's capsnap while the workers list through m
// for about twice the profile window, after the measured turns: where a
// listing's CPU goes in the running server, its transport and audit
// writes included, which BenchmarkDeliver225 does not run.
func (h *harness) profileListings(ctx context.Context, m *listingMode) (*report.Profile, error) {
	file := filepath.Join(h.o.out, "live-"+m.capsnap.Name+".pprof")
	sample, err := profileDuring(ctx, m.capsnap.adminURL, file, func() (mcpload.Sample, error) {
		return m.measure(ctx, math.MaxInt, 2*profileWindow)
	})
	if err != nil {
		return nil, err
	}
	args := []string{"tool", "pprof", "-top", "-cum", "-nodecount", "40", file}
	top, err := pprofText(ctx, args)
	if err != nil {
		return nil, err
	}
	rate := float64(len(sample.Latencies)) / sample.Elapsed.Seconds()
	return &report.Profile{
		What: fmt.Sprintf("CPU profile of the running capsnap (%s), %v while %d workers listed through the response path at %.0f listings/s, after the measured turns; its top 40 functions by cumulative time. "+
			"Divide a function's time by the rate and the window for its cost per listing.", m.capsnap.Name, profileWindow, len(m.clients), rate),
		Command: "go " + strings.Join(args, " "),
		Top:     top,
	}, nil
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
	// want are the tool names every listing must deliver, sorted.
	want    []string
	url     string
	envoy   *server
	capsnap *capsnapServer
	bytes   int
	clients []*http.Client
	ids     atomic.Int64
}

// open gives each worker its own connection, kept alive.
func (m *listingMode) open() {
	for range deliveryWorkers {
		m.clients = append(m.clients, &http.Client{
			Timeout:   deliveryTimeout,
			Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true},
		})
	}
}

func (m *listingMode) close() {
	for _, c := range m.clients {
		c.CloseIdleConnections()
	}
}

// measure has the workers list until they made n listings between them
// or d has passed. Every listing must deliver exactly m.want with an
// epoch; one that does not fails the run.
func (m *listingMode) measure(ctx context.Context, n int, d time.Duration) (mcpload.Sample, error) {
	var left atomic.Int64
	left.Store(int64(n))
	more := func(int) bool { return left.Add(-1) >= 0 }
	return mcpload.Workers(ctx, len(m.clients), d, more, func(w int) (time.Duration, error) {
		one, err := m.listOnce(ctx, m.clients[w])
		return one.elapsed, err
	})
}

// listOnce is one listing through m's Envoy, which must deliver exactly
// m.want and an epoch.
func (m *listingMode) listOnce(ctx context.Context, c *http.Client) (listing, error) {
	one, err := listOnce(ctx, c, m.url, m.ids.Add(1))
	if err != nil {
		return one, err
	}
	if !strings.HasPrefix(one.epoch, "ep_") {
		return one, fmt.Errorf("tools/list: no %s header (got %q)", testbed.EpochHeader, one.epoch)
	}
	if !slices.Equal(one.names, m.want) {
		return one, fmt.Errorf("tools/list: delivered %d tools, want %d: %v", len(one.names), len(m.want), one.names)
	}
	return one, nil
}

// listing is what one tools/list came back with.
type listing struct {
	// elapsed is from sending the request to reading the whole body.
	elapsed time.Duration
	bytes   int
	epoch   string
	// names are the delivered tools', sorted.
	names []string
}

// listOnce posts one tools/list to url as deliveryRole and reads the
// whole answer, which must be HTTP 200 with a JSON-RPC result.
func listOnce(ctx context.Context, c *http.Client, url string, id int64) (listing, error) {
	ctx, cancel := context.WithTimeout(ctx, deliveryTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(fmt.Sprintf(deliveryBody, id)))
	if err != nil {
		return listing{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", deliveryVersion)
	req.Header.Set("Mcp-Method", "tools/list")
	req.Header.Set(testbed.PrincipalHeader, deliveryRole)
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return listing{}, fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, deliveryMaxBody+1))
	elapsed := time.Since(start)
	if err != nil {
		return listing{}, fmt.Errorf("POST %s: %w", url, err)
	}
	one := listing{elapsed: elapsed, bytes: len(body), epoch: resp.Header.Get(testbed.EpochHeader)}
	if resp.StatusCode != http.StatusOK {
		return one, fmt.Errorf("tools/list: HTTP %d (reason %q): %s", resp.StatusCode, resp.Header.Get("x-capsnap-reason"), excerpt(body))
	}
	if len(body) > deliveryMaxBody {
		return one, fmt.Errorf("tools/list: a body over %d bytes", deliveryMaxBody)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return one, fmt.Errorf("tools/list: content type %q, want application/json (mcpfixture's json mode)", ct)
	}
	var msg struct {
		Result *struct {
			Tools []struct {
				Name string `json:"name"`
			} `json:"tools"`
			NextCursor string `json:"nextCursor"`
		} `json:"result"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &msg); err != nil {
		return one, fmt.Errorf("tools/list: %w: %s", err, excerpt(body))
	}
	switch {
	case msg.Error != nil:
		return one, fmt.Errorf("tools/list: JSON-RPC error %s", msg.Error.Message)
	case msg.Result == nil:
		return one, fmt.Errorf("tools/list: no result: %s", excerpt(body))
	case msg.Result.NextCursor != "":
		return one, fmt.Errorf("tools/list: a page with a next cursor: the case is one page")
	}
	for _, t := range msg.Result.Tools {
		one.names = append(one.names, t.Name)
	}
	slices.Sort(one.names)
	return one, nil
}

// excerpt is the start of body, for an error message.
func excerpt(body []byte) string {
	body = bytes.TrimSpace(body)
	if len(body) > 300 {
		return string(body[:300]) + "…"
	}
	return string(body)
}
