package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RedisSentinel is a Redis master, one replica of it, and sentinels that
// watch them under MasterSet, all on free loopback ports: the sentinels
// fail the master over to the replica half a second after it stops
// answering.
type RedisSentinel struct {
	MasterSet string
	Master    *Redis
	Replica   *Redis
	Sentinels []*Redis
}

// StartRedisSentinel starts a master, its replica and n sentinels (a
// quorum of n/2+1) for t, and waits until the replica is in sync and
// every sentinel knows it and the others; t's cleanup stops them.
func StartRedisSentinel(t testing.TB, n int) *RedisSentinel {
	t.Helper()
	s := &RedisSentinel{MasterSet: "capsnap", Master: StartRedis(t)}
	s.Replica = StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(s.Master.port))
	waitRedis(t, s.Replica, "the replica in sync", 10*time.Second, func(r *Redis) bool {
		info, err := r.Do("INFO", "replication")
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	for range n {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d %[3]d\n"+
			"sentinel down-after-milliseconds %[1]s 500\n"+
			"sentinel failover-timeout %[1]s 5000\n", s.MasterSet, s.Master.port, n/2+1)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		r := &Redis{bin: RedisServer(t), dir: dir, port: port, conf: conf, args: []string{"--sentinel"}}
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Stop() })
		s.Sentinels = append(s.Sentinels, r)
	}
	for _, r := range s.Sentinels {
		waitRedis(t, r, "the sentinel to know the replica and the other sentinels", 20*time.Second, func(r *Redis) bool {
			m, err := r.Do("SENTINEL", "MASTER", s.MasterSet)
			return err == nil && field(m, "num-slaves") == "1" && field(m, "num-other-sentinels") == strconv.Itoa(n-1)
		})
	}
	return s
}

// field is the value after name in a flat list of names and values, one
// a line, as Do returns an array.
func field(list, name string) string {
	lines := strings.Split(list, "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		if lines[i] == name {
			return lines[i+1]
		}
	}
	return ""
}

// waitRedis polls cond on r until it holds, failing t after bound.
func waitRedis(t testing.TB, r *Redis, what string, bound time.Duration, cond func(*Redis) bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond(r) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s (%s)", bound, what, r.Addr())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// SentinelAddrs are the sentinels' host:port.
func (s *RedisSentinel) SentinelAddrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, r := range s.Sentinels {
		out[i] = r.Addr()
	}
	return out
}

// MasterAddr is where the sentinels say the master is now.
func (s *RedisSentinel) MasterAddr() (string, error) {
	out, err := s.Sentinels[0].Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterSet)
	if err != nil {
		return "", err
	}
	host, port, ok := strings.Cut(out, "\n")
	if !ok {
		return "", fmt.Errorf("sentinel: no master %s: %q", s.MasterSet, out)
	}
	return host + ":" + port, nil
}
