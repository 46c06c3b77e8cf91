package main

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/prometheus/procfs"

	"github.com/capsnap/capsnap/bench/report"
	"github.com/capsnap/capsnap/testbed"
)

// Pinned peer versions; the Makefile's peers target installs these.
const (
	opaEnvoyModule = "github.com/open-policy-agent/opa-envoy-plugin"
	opaVersion     = "1.15.2-envoy"
)

// findBinaries finds every binary the run needs, or says how to get it.
func (h *harness) findBinaries(context.Context) error {
	for _, b := range []struct {
		path *string
		file string
		how  string
	}{
		{&h.capsnap, filepath.Join(h.o.bin, "capsnap"), "make bench builds it"},
		{&h.billing, filepath.Join(h.o.bin, "billing"), "make bench builds it"},
		{&h.noop, filepath.Join(h.o.bin, "noop"), "make bench builds it from bench/noop"},
		{&h.mcpfixture, filepath.Join(h.o.bin, "mcpfixture"), "make bench builds it from testbed/cmd/mcpfixture"},
		{&h.checkload, filepath.Join(h.o.bin, "checkload"), "make bench builds it from bench/cmd/checkload"},
		{&h.opaEnvoy, filepath.Join(h.o.peers, "opa_envoy"), "make peers builds it"},
	} {
		abs, err := filepath.Abs(b.file)
		if err != nil {
			return err
		}
		if st, err := os.Stat(abs); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("missing %s (%s)", abs, b.how)
		}
		*b.path = abs
	}
	// Another version's figures would not be the ones BENCHMARKS.md says
	// they are.
	if out, err := exec.Command(h.opaEnvoy, "version").Output(); err != nil || !strings.Contains(string(out), "Version: "+opaVersion+"\n") {
		return fmt.Errorf("%s is not opa-envoy-plugin %s (%v): run make peers", h.opaEnvoy, opaVersion, err)
	}
	envoy, err := testbed.FindEnvoy()
	if err != nil {
		return fmt.Errorf("%w (make envoy installs it)", err)
	}
	h.envoy = envoy
	return h.findRedis()
}

// depVersion is the version of module dep inside bin.
func depVersion(bin, dep string) string {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return "?"
	}
	for _, d := range info.Deps {
		if d.Path == dep {
			return d.Version
		}
	}
	return "?"
}

func (h *harness) describeMachine(context.Context) error {
	goVersion, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		return fmt.Errorf("go env GOVERSION: %w", err)
	}
	envoyVersion, err := testbed.EnvoyVersion(h.envoy)
	if err != nil {
		return err
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	cpu, loadAvg := "?", "?"
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if info, err := fs.CPUInfo(); err == nil && len(info) > 0 {
			cpu = info[0].ModelName
		}
		if l, err := fs.LoadAvg(); err == nil {
			loadAvg = fmt.Sprintf("%.2f %.2f %.2f", l.Load1, l.Load5, l.Load15)
		}
	}
	m := report.Machine{
		CPU:     cpu,
		Cores:   runtime.NumCPU(),
		Kernel:  strings.TrimSpace(string(kernel)),
		Go:      strings.TrimSpace(string(goVersion)),
		Envoy:   envoyRelease(envoyVersion),
		OPA:     fmt.Sprintf("opa-envoy-plugin %s (OPA %s)", opaVersion, depVersion(h.opaEnvoy, "github.com/open-policy-agent/opa")),
		Redis:   redisVersion(h.redis),
		Date:    h.started.UTC().Format(time.RFC3339),
		LoadAvg: loadAvg,
	}
	h.results.Machine = m
	h.logf("   %s, %d cores, kernel %s, %s", m.CPU, m.Cores, m.Kernel, m.Go)
	return nil
}

// envoyRelease shortens Envoy's version line ("/path/to/envoy  version:
// <sha>/1.40.0/Clean/RELEASE/BoringSSL") to its release.
func envoyRelease(line string) string {
	_, v, ok := strings.Cut(line, "version: ")
	if parts := strings.Split(strings.TrimSpace(v), "/"); ok && len(parts) > 1 {
		return "Envoy " + parts[1]
	}
	return line
}
