package testbed

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// writeCapsnapConfigs writes capsnap.yaml (replica 0) and, with Redis,
// capsnap-1.yaml and the secret both replicas share.
func (s *Stack) writeCapsnapConfigs() error {
	if s.opts.Envelope && s.envelopeKeys == nil {
		if err := WriteEnvelopeKey(s.EnvelopeKey()); err != nil {
			return fmt.Errorf("stack: %w", err)
		}
		s.envelopeKeys = []string{s.EnvelopeKey()}
	}
	if s.opts.Grants {
		for _, id := range Servers {
			if _, err := os.Stat(GrantKeyFile(s.opts.Dir, id)); err == nil {
				continue
			}
			if err := WriteGrantKey(GrantKeyFile(s.opts.Dir, id)); err != nil {
				return fmt.Errorf("stack: %w", err)
			}
		}
	}
	files := map[string]string{"capsnap.yaml": s.capsnapConfig(0, "")}
	if s.opts.Approvals {
		files["approvers.yaml"] = approverTokens
	}
	if s.opts.Redis != "" {
		// Written once: the replicas keep one secret across restarts.
		if _, err := os.Stat(filepath.Join(s.opts.Dir, "snapshot.key")); err != nil {
			var key [32]byte
			_, _ = rand.Read(key[:])
			files["snapshot.key"] = base64.StdEncoding.EncodeToString(key[:]) + "\n"
		}
		files["capsnap-1.yaml"] = s.capsnapConfig(1, "")
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(s.opts.Dir, name), []byte(content), 0o600); err != nil {
			return fmt.Errorf("stack: %w", err)
		}
	}
	return nil
}

// ReplicaConfig writes replica's configuration again with servers as its
// servers section (a YAML block starting "servers:"), for the next
// StartReplica: a replica whose own view of a server differs from the
// other's.
func (s *Stack) ReplicaConfig(replica int, servers string) error {
	return os.WriteFile(s.replicaConfigPath(replica), []byte(s.capsnapConfig(replica, servers)), 0o600)
}

func (s *Stack) replicaConfigPath(replica int) string {
	if replica == 0 {
		return filepath.Join(s.opts.Dir, "capsnap.yaml")
	}
	return filepath.Join(s.opts.Dir, "capsnap-"+strconv.Itoa(replica)+".yaml")
}

func (s *Stack) grpcPort(replica int) int {
	if replica == 1 {
		return s.opts.Ports.GRPC2
	}
	return s.opts.Ports.GRPC
}

func (s *Stack) adminPort(replica int) int {
	if replica == 1 {
		return s.opts.Ports.Admin2
	}
	return s.opts.Ports.Admin
}

// Replica is capsnap replica 0 (Capsnap) or 1 (Replica2).
func (s *Stack) Replica(i int) *Process {
	if i == 1 {
		return s.Replica2
	}
	return s.Capsnap
}

// ReplicaAdminURL is replica's admin listener.
func (s *Stack) ReplicaAdminURL(replica int) string {
	return "http://" + addr(s.adminPort(replica))
}

// StartReplica (re)starts capsnap replica 0 or 1 and waits until it is
// ready.
func (s *Stack) StartReplica(ctx context.Context, replica int) error {
	name := "capsnap"
	if replica > 0 {
		name = "capsnap-" + strconv.Itoa(replica)
	}
	p, err := Start(name, s.opts.Capsnap, []string{"serve", "--config", s.replicaConfigPath(replica)}, s.opts.Tee)
	if err != nil {
		return err
	}
	if replica == 1 {
		s.Replica2 = p
	} else {
		s.Capsnap = p
	}
	return WaitHTTP(ctx, s.ReplicaAdminURL(replica)+"/readyz", p)
}

// replicaCluster makes the rendered Envoy configuration's capsnap cluster
// two replicas, round robin, each health-checked over grpc.health.v1 often
// enough that a draining replica (capsnap's drain) is out of rotation
// before it stops; without a healthy replica, Envoy has no host and fails
// closed, never panics into sending Checks to an unhealthy one. Two
// failures, not one, and a timeout of a second: on a loaded machine one
// slow answer would otherwise take a healthy replica out. Envoy
// merges health changes for update_merge_window (1s by default) before its
// workers see them: a replica would go on taking Checks for that long
// after it drained, so the window is off.
func replicaCluster(cfg []byte, p Ports) []byte {
	const one = `    load_assignment:
      cluster_name: capsnap
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: %d}
`
	two := fmt.Sprintf(`    lb_policy: ROUND_ROBIN
    common_lb_config: {healthy_panic_threshold: {value: 0}, update_merge_window: 0s}
    health_checks:
    - timeout: 1s
      interval: 0.1s
      no_traffic_interval: 0.1s
      unhealthy_threshold: 2
      healthy_threshold: 1
      grpc_health_check: {}
    load_assignment:
      cluster_name: capsnap
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: %d}
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: %d}
`, p.GRPC, p.GRPC2)
	from := []byte(fmt.Sprintf(one, p.GRPC))
	if !bytes.Contains(cfg, from) {
		panic("testbed: the Envoy configuration has no single-endpoint capsnap cluster to replace")
	}
	cfg = bytes.Replace(cfg, from, []byte(two), 1)
	// Every answer goes to ext_proc: on one round-robin cluster every Check
	// would go to one replica and every ext_proc stream to the other, and
	// no test would see Checks alternate.
	return extProcCluster(cfg, func(c string) string { return c })
}

// crossReplicas sends every Check to replica 0 and every ext_proc stream to
// replica 1: each listing's Check and response are decided on different
// replicas, whatever round robin would have done.
func crossReplicas(cfg []byte, p Ports) []byte {
	return extProcCluster(cfg, func(c string) string {
		return strings.Replace(c, fmt.Sprintf("port_value: %d}", p.GRPC), fmt.Sprintf("port_value: %d}", p.GRPC2), 1)
	})
}

// extProcCluster gives the response path (capsnap.ext_proc) a cluster of
// its own: capsnap's, as edit changes it.
func extProcCluster(cfg []byte, edit func(cluster string) string) []byte {
	s := string(cfg)
	start := strings.Index(s, "  - name: capsnap\n")
	end := strings.Index(s[start+1:], "\n  - name: ")
	filter := strings.Index(s, "name: capsnap.ext_proc")
	ref := "envoy_grpc: {cluster_name: capsnap}"
	at := strings.Index(s[max(filter, 0):], ref)
	if start < 0 || end < 0 || filter < 0 || at < 0 {
		panic("testbed: the Envoy configuration has no capsnap cluster or capsnap.ext_proc filter to split")
	}
	cluster := s[start : start+1+end+1]
	at += filter
	s = s[:at] + "envoy_grpc: {cluster_name: capsnap_ext_proc}" + s[at+len(ref):]
	own := edit(strings.ReplaceAll(cluster, "name: capsnap\n", "name: capsnap_ext_proc\n"))
	return []byte(strings.Replace(s, cluster, cluster+own, 1))
}
