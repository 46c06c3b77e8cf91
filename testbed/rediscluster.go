package testbed

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RedisCluster is a Redis Cluster of redis-server nodes on free loopback
// ports, every slot served, no replicas: made the way an operator makes
// one, with redis-cli --cluster create.
type RedisCluster struct {
	Nodes []*Redis
}

// StartRedisCluster starts a cluster of n nodes (at least 3, as
// redis-cli requires) for t, and waits until every node says
// cluster_state:ok; t's cleanup stops them.
func StartRedisCluster(t testing.TB, n int) *RedisCluster {
	t.Helper()
	cli := redisCLI(t)
	c := &RedisCluster{}
	for range n {
		// The bus port picked free too: by default it is the port plus
		// 10000, which another test's server may hold.
		bus, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		c.Nodes = append(c.Nodes, StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--cluster-port", strconv.Itoa(bus)))
	}
	args := append(append([]string{"--cluster", "create"}, c.Addrs()...), "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, node := range c.Nodes {
		for {
			info, err := node.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s not ok after 20s: %v\n%s", node.Addr(), err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// redisCLI is the redis-cli beside $CAPSNAP_REDIS_SERVER's redis-server,
// or on $PATH: under `make test`, a missing one fails t.
func redisCLI(t testing.TB) string {
	t.Helper()
	server, err := exec.LookPath(RedisServer(t))
	if err != nil {
		t.Fatal(err)
	}
	if cli := filepath.Join(filepath.Dir(server), "redis-cli"); isExecutable(cli) {
		return cli
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("$%s=%s, but no redis-cli beside it or on $PATH: %v", RedisServerEnv, server, err)
	}
	return cli
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// Addrs are the nodes' host:port.
func (c *RedisCluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}

// Do sends one command to the node that serves its key (the second
// argument), following the cluster's MOVED answer: for what a test asks of
// Redis itself, with no client library between.
func (c *RedisCluster) Do(args ...string) (string, error) {
	addr := c.Nodes[0].Addr()
	for range len(c.Nodes) {
		out, err := redisDo(addr, args...)
		var moved *RedisError
		if !errors.As(err, &moved) || !strings.HasPrefix(moved.Reply, "MOVED ") {
			return out, err
		}
		// MOVED <slot> <host:port>
		f := strings.Fields(moved.Reply)
		if len(f) != 3 {
			return "", fmt.Errorf("redis cluster: %w", err)
		}
		addr = f[2]
	}
	return "", fmt.Errorf("redis cluster: %v moved more than %d times", args, len(c.Nodes))
}

// Each sends one command to every node, and returns their answers in the
// order of Nodes.
func (c *RedisCluster) Each(args ...string) ([]string, error) {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		var err error
		if out[i], err = n.Do(args...); err != nil {
			return nil, fmt.Errorf("%s: %w", n.Addr(), err)
		}
	}
	return out, nil
}
