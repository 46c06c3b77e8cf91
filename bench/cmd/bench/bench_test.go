package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/bench/proc"
	"github.com/capsnap/capsnap/envoy"
	"github.com/capsnap/capsnap/policy"
)

func TestWithoutExtAuthz(t *testing.T) {
	out, err := withoutExtAuthz(envoy.Demo)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if strings.Contains(s, "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz\n") || strings.Contains(s, "cluster_name: capsnap\n                timeout") {
		t.Fatalf("the ext_authz filter is still there:\n%s", s)
	}
	for _, keep := range []string{"envoy.filters.http.router", "prefix: \"/billing/\"", "cluster: billing", "json_format"} {
		if !strings.Contains(s, keep) {
			t.Errorf("lost %q", keep)
		}
	}
	if _, err := withoutExtAuthz(out); err == nil {
		t.Fatal("removed an ext_authz filter from a configuration without one")
	}
}

func TestWithoutExtProc(t *testing.T) {
	out, err := withoutExtProc(envoy.Demo)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if strings.Contains(s, extProcFilter) || strings.Contains(s, "ExternalProcessor") {
		t.Fatalf("the response path is still there:\n%s", s)
	}
	for _, keep := range []string{extAuthzFilter, "envoy.filters.http.router", "context_extensions: {server_id: billing}", "cluster: billing"} {
		if !strings.Contains(s, keep) {
			t.Errorf("lost %q", keep)
		}
	}
	if _, err := withoutExtProc(out); err == nil {
		t.Fatal("removed an ext_proc filter from a configuration without one")
	}
}

func TestWithEndpoints(t *testing.T) {
	out, err := withEndpoints(envoy.Demo, []string{"127.0.0.1:9011"})
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
	if _, err := withEndpoints(out, []string{"127.0.0.1:9021"}); err == nil {
		t.Fatal("added to a capsnap cluster that already has two endpoints")
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

// go tool pprof -top -cum's text, as it prints it.
const pprofTop = `File: capsnap
Type: cpu
Duration: 3s, Total samples = 1.44s (47.99%)
Showing nodes accounting for 1.44s, 100% of 1.44s total
      flat  flat%   sum%        cum   cum%
         0     0%     0%      0.98s 68.06%  google.golang.org/grpc.(*Server).handleStream
     0.01s  0.69%  0.69%      0.38s 26.39%  github.com/capsnap/capsnap/extauthz.(*Server).Check
         0     0%  0.69%      0.30s 20.83%  google.golang.org/grpc.(*serverStream).RecvMsg
         0     0%  0.69%      0.20s 13.89%  google.golang.org/grpc.(*serverStream).SendMsg
         0     0%  0.69%      0.08s  5.56%  github.com/capsnap/capsnap/audit.(*Writer).flush
     0.01s  0.69%  1.38%       10ms  0.69%  runtime.nextFreeFast (inline)
`

func TestParseTopAndSplit(t *testing.T) {
	total, cum, err := parseTop(pprofTop)
	if err != nil {
		t.Fatal(err)
	}
	if total != 1440*time.Millisecond || cum["github.com/capsnap/capsnap/extauthz.(*Server).Check"] != 380*time.Millisecond ||
		cum["runtime.nextFreeFast"] != 10*time.Millisecond {
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
	if _, _, err := parseTop("File: capsnap\n"); err == nil {
		t.Error("a text without samples parsed")
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
