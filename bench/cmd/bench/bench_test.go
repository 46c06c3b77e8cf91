package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/bench/mcpload"
	"github.com/capsnap/capsnap/bench/proc"
	"github.com/capsnap/capsnap/envoy"
	"github.com/capsnap/capsnap/policy"
)

// Each filter goes, alone: the other HTTP filters, the routes and the
// clusters stay.
func TestWithoutFilter(t *testing.T) {
	for _, tc := range []struct {
		filter     string
		gone, kept []string
	}{
		{extAuthzFilter, []string{"v3.ExtAuthz\n"}, []string{"name: " + extProcFilter, "envoy.filters.http.router", "prefix: /billing/", "cluster: billing", "json_format"}},
		{extProcFilter, []string{"ExternalProcessor"}, []string{"name: " + extAuthzFilter, "envoy.filters.http.router", "server_id: billing", "cluster: billing"}},
	} {
		out, err := withoutFilter(envoy.Demo, tc.filter)
		if err != nil {
			t.Fatal(err)
		}
		s := string(out)
		for _, gone := range append(tc.gone, "name: "+tc.filter+"\n") {
			if strings.Contains(s, gone) {
				t.Errorf("without %s: %q is still there", tc.filter, gone)
			}
		}
		for _, keep := range tc.kept {
			if !strings.Contains(s, keep) {
				t.Errorf("without %s: lost %q", tc.filter, keep)
			}
		}
		if _, err := withoutFilter(out, tc.filter); err == nil {
			t.Errorf("removed %s from a configuration without one", tc.filter)
		}
	}
}

func TestWithEndpoints(t *testing.T) {
	out, err := withEndpoints(envoy.Demo, []string{"127.0.0.1:9001", "127.0.0.1:9011"})
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		StaticResources struct {
			Clusters []struct {
				Name           string `yaml:"name"`
				LoadAssignment struct {
					Endpoints []struct {
						LBEndpoints []struct {
							Endpoint struct {
								Address struct {
									SocketAddress struct {
										Address   string `yaml:"address"`
										PortValue int    `yaml:"port_value"`
									} `yaml:"socket_address"`
								} `yaml:"address"`
							} `yaml:"endpoint"`
						} `yaml:"lb_endpoints"`
					} `yaml:"endpoints"`
				} `yaml:"load_assignment"`
			} `yaml:"clusters"`
		} `yaml:"static_resources"`
	}
	if err := yaml.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	ports := map[string][]int{}
	for _, c := range cfg.StaticResources.Clusters {
		for _, e := range c.LoadAssignment.Endpoints {
			for _, lb := range e.LBEndpoints {
				a := lb.Endpoint.Address.SocketAddress
				if a.Address != "127.0.0.1" {
					t.Errorf("%s: endpoint address %q", c.Name, a.Address)
				}
				ports[c.Name] = append(ports[c.Name], a.PortValue)
			}
		}
	}
	if !slices.Equal(ports["capsnap"], []int{9001, 9011}) || !slices.Equal(ports["billing"], []int{8081}) {
		t.Fatalf("endpoints %v", ports)
	}
	if _, err := withEndpoints(envoy.Demo, []string{"127.0.0.1:9021", "127.0.0.1:9011"}); err == nil {
		t.Fatal("added to an endpoint the capsnap cluster does not have")
	}
}

// The delivery case's policy classifies every tool and grants the role
// exactly deliveryGranted of them, the first and the last among them.
func TestDeliveryPolicy(t *testing.T) {
	var tools []string
	for i := range deliveryCatalog {
		tools = append(tools, fmt.Sprintf("tool_%03d", i+1))
	}
	b, granted := deliveryPolicy(tools)
	if len(granted) != deliveryGranted || !slices.IsSorted(granted) || granted[0] != "tool_001" || granted[len(granted)-1] != "tool_225" {
		t.Fatalf("granted %v", granted)
	}
	p, err := policy.Parse(b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if got := p.Allowed(deliveryRole, "billing"); !slices.Equal(got, granted) {
		t.Fatalf("the policy allows %v, want %v", got, granted)
	}
	for _, tool := range tools {
		_, err := p.Decide(deliveryRole, "billing", tool)
		if slices.Contains(granted, tool) != (err == nil) {
			t.Errorf("%s: %v", tool, err)
		}
		if err != nil && !strings.Contains(err.Error(), "not granted") {
			t.Errorf("%s is not classified: %v", tool, err)
		}
	}
}

// An ext_proc stream count is read from Envoy's /stats text by its full
// name; one that is not there is an error, never zero streams.
func TestParseCounter(t *testing.T) {
	stats := []byte("cluster.capsnap.upstream_rq_total: 9\n" + extProcStat + ": 1234\nhttp.mcp.ext_proc.streams_started_total: 5\n")
	if n, err := parseCounter(stats, extProcStat); err != nil || n != 1234 {
		t.Fatalf("got %d, %v", n, err)
	}
	if n, err := parseCounter([]byte(extProcStat+": 0\n"), extProcStat); err != nil || n != 0 {
		t.Fatalf("a zero count: %d, %v", n, err)
	}
	for _, bad := range []string{"", "http.mcp.ext_proc.streams_failed: 3\n", extProcStat + ": many\n"} {
		if n, err := parseCounter([]byte(bad), extProcStat); err == nil {
			t.Errorf("%q read as %d", bad, n)
		}
	}
}

func TestEnvoyRelease(t *testing.T) {
	line := "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/envoy/_bin/envoy  version: 9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL"
	if got := envoyRelease(line); got != "Envoy 1.40.0" {
		t.Fatalf("got %q", got)
	}
}

func TestCheckRequestCarriesTheBody(t *testing.T) {
	req := checkRequest(refundBody, "ep_1")
	h := req.GetAttributes().GetRequest().GetHttp()
	if string(h.GetRawBody()) != refundBody || h.GetHeaders()[epochKey] != "ep_1" || h.GetHeaders()["content-length"] != strconv.Itoa(len(refundBody)) {
		t.Fatalf("%v", h)
	}
	if req.GetAttributes().GetSource().GetPrincipal() != agent || req.GetAttributes().GetContextExtensions()["server_id"] != serverID {
		t.Fatalf("%v", req.GetAttributes())
	}
	if _, ok := checkRequest(listBody, "").GetAttributes().GetRequest().GetHttp().GetHeaders()[epochKey]; ok {
		t.Fatal("an epoch header without an epoch")
	}
}

// cpuProfile writes a CPU profile of stacks, each a sample of its time
// and its frames from the leaf; a frame of several functions is one
// location's inlined calls.
func cpuProfile(t *testing.T, stacks []struct {
	d      time.Duration
	frames [][]string
}) string {
	p := &profile.Profile{SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}}}
	funcs := map[string]*profile.Function{}
	for _, st := range stacks {
		s := &profile.Sample{Value: []int64{1, int64(st.d)}}
		for _, frame := range st.frames {
			loc := &profile.Location{ID: uint64(len(p.Location) + 1)}
			for _, name := range frame {
				if funcs[name] == nil {
					funcs[name] = &profile.Function{ID: uint64(len(p.Function) + 1), Name: name}
					p.Function = append(p.Function, funcs[name])
				}
				loc.Line = append(loc.Line, profile.Line{Function: funcs[name]})
			}
			p.Location = append(p.Location, loc)
			s.Location = append(s.Location, loc)
		}
		p.Sample = append(p.Sample, s)
	}
	file := filepath.Join(t.TempDir(), "cpu.pprof")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := p.Write(f); err != nil {
		t.Fatal(err)
	}
	return file
}

func TestCumulativeAndSplit(t *testing.T) {
	const handle = "google.golang.org/grpc.(*Server).handleStream"
	check, flush, recv, send := cpuParts[0].fn, cpuParts[1].fn, cpuParts[2].fn, cpuParts[3].fn
	ms := time.Millisecond
	file := cpuProfile(t, []struct {
		d      time.Duration
		frames [][]string
	}{
		// Check twice on one stack (a recursion) counts once; an inlined
		// call counts as its function.
		{300 * ms, [][]string{{"runtime.nextFreeFast", "runtime.mallocgc"}, {check}, {check}, {handle}}},
		{80 * ms, [][]string{{"syscall.write"}, {flush}, {check}, {handle}}},
		{300 * ms, [][]string{{recv}, {handle}}},
		{200 * ms, [][]string{{send}, {handle}}},
		{560 * ms, [][]string{{"runtime.findRunnable"}}},
	})
	total, cum, err := cumulative(file)
	if err != nil {
		t.Fatal(err)
	}
	if total != 1440*ms || cum[check] != 380*ms || cum[handle] != 880*ms || cum["runtime.nextFreeFast"] != 300*ms {
		t.Fatalf("total %v, cum %v", total, cum)
	}
	// 1.44 s of samples over 1000 Checks: 1.44 ms each, of which the
	// decision 380 µs, 80 of them the audit write, and nothing for a part
	// with no samples.
	got := split(total, cum, 1000)
	want := map[string]time.Duration{
		cpuParts[0].part: 300 * time.Microsecond, cpuParts[1].part: 80 * time.Microsecond,
		cpuParts[2].part: 300 * time.Microsecond, cpuParts[3].part: 200 * time.Microsecond,
		cpuParts[4].part: 0, restPart: 560 * time.Microsecond,
	}
	for part, d := range want {
		if got[part] != d {
			t.Errorf("%s: %v, want %v", part, got[part], d)
		}
	}
	if _, _, err := cumulative(cpuProfile(t, nil)); err == nil {
		t.Error("a profile without samples read")
	}
}

// A tally charges each process what it spent during its turns, and each
// call its share; a turn that fails adds nothing.
func TestCPUTally(t *testing.T) {
	tally := newCPUTally(theLoad())
	burn := func(calls int) func() (int, error) {
		return func() (int, error) {
			// Spin until this process has spent 50 ms more, a few clock
			// ticks (proc.CPU counts in ticks), however busy the machine.
			start, err := proc.CPU(os.Getpid())
			for err == nil {
				var now time.Duration
				if now, err = proc.CPU(os.Getpid()); now-start >= 50*time.Millisecond {
					break
				}
			}
			return calls, err
		}
	}
	for range 2 {
		if err := tally.during(burn(50)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tally.during(func() (int, error) { return 7, fmt.Errorf("a failed turn") }); err == nil {
		t.Fatal("a failed turn's error was lost")
	}
	got := tally.perCall()
	if len(got) != 1 || got[0].Process != "the load" {
		t.Fatalf("perCall = %+v", got)
	}
	if got[0].CPU < 100*time.Millisecond || got[0].CPU > 10*time.Second {
		t.Errorf("the load spent %v over two turns of 50 ms or more", got[0].CPU)
	}
	if got[0].PerCall != got[0].CPU/100 {
		t.Errorf("per call %v, want %v ÷ 100 calls", got[0].PerCall, got[0].CPU)
	}
	if newCPUTally(theLoad()).perCall() != nil {
		t.Error("a tally without calls has figures")
	}
}

// Every server or mode takes as many turns as the others, in order and
// then back, so that the turns of each are spread over the whole step.
// Contenders take their turns in turn order, each summed up over its own
// turns; a failed turn ends them.
func TestTakeTurns(t *testing.T) {
	var order []int
	tallies := []*cpuTally{newCPUTally(theLoad()), newCPUTally(theLoad())}
	res, err := takeTurns(tallies, func(i int) (mcpload.Sample, int, error) {
		order = append(order, i)
		return mcpload.Sample{Latencies: []time.Duration{time.Duration(i+1) * time.Millisecond}, Elapsed: time.Second}, 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(order, turnOrder(2)) {
		t.Fatalf("turns %v, want %v", order, turnOrder(2))
	}
	for i, samples := range res {
		r := mcpload.Summarize(samples...)
		if r.Calls != turns || r.P50 != time.Duration(i+1)*time.Millisecond || r.Elapsed != turns*time.Second || tallies[i].calls != turns {
			t.Errorf("contender %d: %+v, %d calls tallied", i, r, tallies[i].calls)
		}
	}
	n := 0
	if _, err := takeTurns(tallies, func(int) (mcpload.Sample, int, error) {
		n++
		return mcpload.Sample{}, 0, fmt.Errorf("refused")
	}); err == nil || n != 1 {
		t.Fatalf("a failed turn: %v after %d turns", err, n)
	}
}

func TestTurnOrder(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want []int
	}{
		{1, []int{0, 0, 0, 0}},
		{2, []int{0, 1, 1, 0, 0, 1, 1, 0}},
		{3, []int{0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0}},
	} {
		if got := turnOrder(tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("turnOrder(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}
