// Package opa is the OPA-Envoy peer of make bench: the Rego policy, its
// data and OPA's configuration (the files beside this one), and how to
// lay them out and run opa-envoy-plugin over them.
package opa

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

var (
	//go:embed policy.rego
	policy []byte
	//go:embed data.json
	data []byte
	//go:embed config.yaml
	config []byte
)

// TemplateEpoch is the snapshot epoch data.json is written with. capsnap
// mints a random epoch for each run, and the three servers must see the
// same request bytes, so the data OPA runs on has this epoch replaced by
// capsnap's (Data).
const TemplateEpoch = "ep_bench"

// Data is data.json with its one snapshot under epoch instead of
// TemplateEpoch.
func Data(epoch string) ([]byte, error) {
	template, _ := json.Marshal(TemplateEpoch)
	if n := bytes.Count(data, template); n != 1 {
		return nil, fmt.Errorf("opa data.json: %d snapshots %s, want one", n, template)
	}
	to, err := json.Marshal(epoch)
	return bytes.Replace(data, template, to, 1), err
}

// Files writes the policy, the data for epoch and the configuration into
// dir, and returns opa-envoy-plugin's arguments to serve them: the Check
// service on grpcAddr, and /health on diagAddr (OPA's REST API, which the
// benchmark does not use, on apiAddr).
func Files(dir, epoch, grpcAddr, apiAddr, diagAddr string) ([]string, error) {
	d, err := Data(epoch)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{"policy.rego": policy, "data.json": d, "config.yaml": config}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return nil, fmt.Errorf("opa files: %w", err)
		}
	}
	return []string{
		"run", "--server",
		"--addr", apiAddr, "--diagnostic-addr", diagAddr,
		"--config-file", filepath.Join(dir, "config.yaml"),
		"--set", "plugins.envoy_ext_authz_grpc.addr=" + grpcAddr,
		// No call out to GitHub for the latest version: loopback only.
		"--skip-version-check",
		"--log-level", "error",
		filepath.Join(dir, "policy.rego"), filepath.Join(dir, "data.json"),
	}, nil
}
