package testbed

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// With replicas, Checks and ext_proc streams take turns on clusters of
// their own, each of both replicas.
func TestReplicaClusters(t *testing.T) {
	p := Ports{Envoy: 1, Admin: 2, GRPC: 3, GRPC2: 4, Billing: 5, Payments: 6}
	cfg := replicaCluster(EnvoyConfig(p), p)
	var doc struct {
		StaticResources struct {
			Clusters []struct {
				Name   string `yaml:"name"`
				Policy string `yaml:"lb_policy"`
				Load   struct {
					Name      string `yaml:"cluster_name"`
					Endpoints []struct {
						LB []any `yaml:"lb_endpoints"`
					} `yaml:"endpoints"`
				} `yaml:"load_assignment"`
			} `yaml:"clusters"`
		} `yaml:"static_resources"`
	}
	if err := yaml.Unmarshal(cfg, &doc); err != nil {
		t.Fatalf("%v\n%s", err, cfg)
	}
	found := map[string]bool{}
	for _, c := range doc.StaticResources.Clusters {
		if c.Name == "capsnap" || c.Name == "capsnap_ext_proc" {
			found[c.Name] = true
			if c.Policy != "ROUND_ROBIN" || c.Load.Name != c.Name || len(c.Load.Endpoints) != 1 || len(c.Load.Endpoints[0].LB) != 2 {
				t.Errorf("cluster %s: %+v, want both replicas, round robin", c.Name, c)
			}
		}
	}
	if len(found) != 2 {
		t.Fatalf("clusters %v, want capsnap and capsnap_ext_proc", found)
	}
	s := string(cfg)
	if i := strings.Index(s, "name: capsnap.ext_proc"); i < 0 || !strings.Contains(s[i:], "cluster_name: capsnap_ext_proc}") || strings.Count(s, "envoy_grpc: {cluster_name: capsnap}") != 1 {
		t.Errorf("the ext_proc filter does not use capsnap_ext_proc, or ext_authz does not use capsnap:\n%s", cfg)
	}
}

// Crossed, the Checks go to replica 0 alone and the ext_proc streams to
// replica 1 alone.
func TestCrossReplicas(t *testing.T) {
	p := Ports{Envoy: 1, Admin: 2, GRPC: 3, GRPC2: 4, Billing: 5, Payments: 6}
	s := string(crossReplicas(EnvoyConfig(p), p))
	authz, proc := strings.Index(s, "  - name: capsnap\n"), strings.Index(s, "  - name: capsnap_ext_proc\n")
	if authz < 0 || proc < 0 {
		t.Fatalf("no capsnap or capsnap_ext_proc cluster:\n%s", s)
	}
	end := func(from int) string {
		rest := s[from+1:]
		if i := strings.Index(rest, "\n  - name: "); i >= 0 {
			return rest[:i]
		}
		return rest
	}
	if c := end(authz); !strings.Contains(c, "port_value: 3}") || strings.Contains(c, "port_value: 4}") {
		t.Errorf("the Checks' cluster is not replica 0 alone:\n%s", c)
	}
	if c := end(proc); !strings.Contains(c, "port_value: 4}") || strings.Contains(c, "port_value: 3}") {
		t.Errorf("the ext_proc cluster is not replica 1 alone:\n%s", c)
	}
}
