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

// opaVersion is the OPA-Envoy the Makefile's peers target builds: another
// version's figures would not be the ones BENCHMARKS.md says they are.
const opaVersion = "1.15.2-envoy"

// findBinaries finds every binary the run needs, or says how to get it.
func (h *harness) findBinaries(context.Context) error {
	for _, b := range []struct {
		path *string
		file string
	}{
		{&h.capsnap, filepath.Join(h.o.bin, "capsnap")}, {&h.billing, filepath.Join(h.o.bin, "billing")},
		{&h.noop, filepath.Join(h.o.bin, "noop")}, {&h.mcpfixture, filepath.Join(h.o.bin, "mcpfixture")},
		{&h.checkload, filepath.Join(h.o.bin, "checkload")}, {&h.opaEnvoy, filepath.Join(h.o.peers, "opa_envoy")},
	} {
		abs, err := filepath.Abs(b.file)
		if err != nil {
			return err
		}
		if st, err := os.Stat(abs); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("missing %s (make bench builds it, and make peers OPA-Envoy)", abs)
		}
		*b.path = abs
	}
	if out, err := exec.Command(h.opaEnvoy, "version").Output(); err != nil || !strings.Contains(string(out), "Version: "+opaVersion+"\n") {
		return fmt.Errorf("%s is not opa-envoy-plugin %s (%v): run make peers", h.opaEnvoy, opaVersion, err)
	}
	var err error
	if h.envoy, err = testbed.FindEnvoy(); err != nil {
		return fmt.Errorf("%w (make envoy installs it)", err)
	}
	// redis-server as the tests find it, through $CAPSNAP_REDIS_SERVER
	// (make bench sets it), else on PATH; the variable is set for the go
	// test runs the harness starts.
	bin := os.Getenv(testbed.RedisServerEnv)
	if bin == "" {
		bin = "redis-server"
	}
	if h.redis, err = exec.LookPath(bin); err != nil {
		return fmt.Errorf("no redis-server (%v): make redis installs it", err)
	}
	if h.redis, err = filepath.Abs(h.redis); err != nil {
		return err
	}
	return os.Setenv(testbed.RedisServerEnv, h.redis)
}

func (h *harness) describeMachine(context.Context) error {
	envoyVersion, err := testbed.EnvoyVersion(h.envoy)
	if err != nil {
		return err
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	redis, _ := exec.Command(h.redis, "--version").Output()
	m := report.Machine{
		CPU: "?", Cores: runtime.NumCPU(), Kernel: strings.TrimSpace(string(kernel)), Go: runtime.Version(),
		Envoy: envoyRelease(envoyVersion), Redis: "?", Date: h.started.UTC().Format(time.RFC3339), LoadAvg: "?",
		OPA: fmt.Sprintf("opa-envoy-plugin %s (OPA %s)", opaVersion, depVersion(h.opaEnvoy, "github.com/open-policy-agent/opa")),
	}
	// "Redis server v=7.0.15 sha=…"
	for _, f := range strings.Fields(string(redis)) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			m.Redis = "Redis " + v
		}
	}
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if info, err := fs.CPUInfo(); err == nil && len(info) > 0 {
			m.CPU = info[0].ModelName
		}
		if l, err := fs.LoadAvg(); err == nil {
			m.LoadAvg = fmt.Sprintf("%.2f %.2f %.2f", l.Load1, l.Load5, l.Load15)
		}
	}
	h.results.Machine = m
	h.logf("   %s, %d cores, kernel %s, %s", m.CPU, m.Cores, m.Kernel, m.Go)
	return nil
}

// depVersion is the version of module dep inside bin.
func depVersion(bin, dep string) string {
	if info, err := buildinfo.ReadFile(bin); err == nil {
		for _, d := range info.Deps {
			if d.Path == dep {
				return d.Version
			}
		}
	}
	return "?"
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
