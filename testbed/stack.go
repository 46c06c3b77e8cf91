package testbed

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/capsnap/capsnap/envoy"
)

// Ports are the loopback ports of one stack.
type Ports struct {
	Envoy, EnvoyAdmin, GRPC, Admin, Billing int
}

// DemoPorts are the ports envoy/demo.yaml and capsnap's defaults use.
var DemoPorts = Ports{Envoy: 10000, EnvoyAdmin: 9901, GRPC: 9001, Admin: 9002, Billing: 8081}

// RandomPorts picks free ports, so that tests can run side by side.
func RandomPorts() (Ports, error) {
	var p Ports
	for _, f := range []*int{&p.Envoy, &p.EnvoyAdmin, &p.GRPC, &p.Admin, &p.Billing} {
		n, err := FreePort()
		if err != nil {
			return Ports{}, err
		}
		*f = n
	}
	return p, nil
}

// EnvoyConfig is envoy/demo.yaml with its ports replaced by p's.
func EnvoyConfig(p Ports) []byte {
	cfg := envoy.Demo
	for from, to := range map[int]int{
		DemoPorts.Envoy: p.Envoy, DemoPorts.EnvoyAdmin: p.EnvoyAdmin,
		DemoPorts.GRPC: p.GRPC, DemoPorts.Billing: p.Billing,
	} {
		cfg = bytes.ReplaceAll(cfg, []byte("port_value: "+strconv.Itoa(from)+"}"), []byte("port_value: "+strconv.Itoa(to)+"}"))
	}
	return cfg
}

// StackOptions configure StartStack.
type StackOptions struct {
	// Capsnap and Billing are the built binaries.
	Capsnap, Billing string
	// Envoy is the Envoy binary.
	Envoy string
	Ports Ports
	// Dir holds the generated configuration files.
	Dir string
	// Policy is the policy file's content.
	Policy []byte
	// Tee, if set, also receives every process's output.
	Tee io.Writer
}

// Stack is Envoy in front of the billing server, with capsnap deciding.
type Stack struct {
	opts                    StackOptions
	Envoy, Capsnap, Billing *Process
	// EnvoyVersion is what the running Envoy says it is.
	EnvoyVersion string
}

// StartStack starts billing, capsnap and Envoy, and waits until each is ready.
func StartStack(ctx context.Context, o StackOptions) (_ *Stack, err error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	s := &Stack{opts: o}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.EnvoyVersion, err = EnvoyVersion(o.Envoy); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.Dir, "policy.yaml"), o.Policy, 0o600); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	if err := os.WriteFile(filepath.Join(o.Dir, "capsnap.yaml"), []byte(s.capsnapConfig()), 0o600); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	if err := os.WriteFile(filepath.Join(o.Dir, "envoy.yaml"), EnvoyConfig(o.Ports), 0o600); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}

	if s.Billing, err = Start("billing", o.Billing, []string{"-addr", addr(o.Ports.Billing)}, o.Tee); err != nil {
		return nil, err
	}
	if err := WaitHTTP(ctx, s.BillingURL()+"/admin/stats", s.Billing); err != nil {
		return nil, err
	}
	if err := s.StartCapsnap(ctx); err != nil {
		return nil, err
	}
	s.Envoy, err = Start("envoy", o.Envoy, []string{
		"-c", filepath.Join(o.Dir, "envoy.yaml"),
		"--disable-hot-restart", "--concurrency", "1", "-l", "warning",
	}, o.Tee)
	if err != nil {
		return nil, err
	}
	if err := WaitHTTP(ctx, fmt.Sprintf("http://%s/ready", addr(o.Ports.EnvoyAdmin)), s.Envoy); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Stack) capsnapConfig() string {
	return fmt.Sprintf(`grpc_addr: %s
admin_addr: %s
policy_file: policy.yaml
# Development only: the demo has no mTLS, so the client names itself.
principal: {source: header, insecure_header: true}
servers:
  - id: billing
    url: %s/mcp
log: {level: info, format: json}
`, addr(s.opts.Ports.GRPC), addr(s.opts.Ports.Admin), s.BillingURL())
}

// StartCapsnap (re)starts capsnap and waits until its catalog is ready.
func (s *Stack) StartCapsnap(ctx context.Context) (err error) {
	s.Capsnap, err = Start("capsnap", s.opts.Capsnap, []string{"serve", "--config", filepath.Join(s.opts.Dir, "capsnap.yaml")}, s.opts.Tee)
	if err != nil {
		return err
	}
	return WaitHTTP(ctx, fmt.Sprintf("http://%s/readyz", addr(s.opts.Ports.Admin)), s.Capsnap)
}

// MCPURL is the billing server's MCP endpoint behind Envoy.
func (s *Stack) MCPURL() string {
	return fmt.Sprintf("http://%s/billing/mcp", addr(s.opts.Ports.Envoy))
}

// BillingURL is the billing server itself, bypassing Envoy.
func (s *Stack) BillingURL() string { return "http://" + addr(s.opts.Ports.Billing) }

// AdminURL is capsnap's admin listener.
func (s *Stack) AdminURL() string { return "http://" + addr(s.opts.Ports.Admin) }

// BillingStats is what the billing server reports of itself.
type BillingStats struct {
	Variant       string         `json:"variant"`
	HandlerStarts map[string]int `json:"handler_starts"`
}

// Stats asks the billing server how often each handler started.
func (s *Stack) Stats(ctx context.Context) (BillingStats, error) {
	var st BillingStats
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.BillingURL()+"/admin/stats", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("billing stats: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("billing stats: %w", err)
	}
	return st, nil
}

// Redeploy switches the billing server to another variant of its tools.
func (s *Stack) Redeploy(ctx context.Context, variant string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.BillingURL()+"/admin/variant", strings.NewReader(variant))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("redeploy billing: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("redeploy billing to %q: %s: %s", variant, resp.Status, b)
	}
	return nil
}

// Close stops every process, Envoy first.
func (s *Stack) Close() {
	for _, p := range []*Process{s.Envoy, s.Capsnap, s.Billing} {
		if p != nil {
			_ = p.Stop()
		}
	}
}

func addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// readyTimeout bounds how long a whole stack may take to come up.
const readyTimeout = 30 * time.Second
