package testbed

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RedisServerEnv names the redis-server binary the tests that need one
// run. `make test` sets it; plain `go test` leaves it unset, and those
// tests are skipped.
const RedisServerEnv = "CAPSNAP_REDIS_SERVER"

// RedisServer returns the redis-server binary, skipping t when
// $CAPSNAP_REDIS_SERVER is unset and failing it when it names nothing that
// runs: under `make test` a missing Redis is a failure, never a skip.
func RedisServer(t testing.TB) string {
	t.Helper()
	bin := os.Getenv(RedisServerEnv)
	if bin == "" {
		t.Skipf("$%s is unset: this test needs a real redis-server (make test installs and sets it)", RedisServerEnv)
	}
	if _, err := exec.LookPath(bin); err != nil {
		t.Fatalf("$%s=%s: %v", RedisServerEnv, bin, err)
	}
	return bin
}

// Redis is a redis-server on a free loopback port: empty, without
// persistence, so that a restart brings it back empty.
type Redis struct {
	bin  string
	dir  string
	port int
	// conf, if set, is a configuration file the server reads first (a
	// sentinel's, which it rewrites).
	conf string
	args []string
	proc *Process
}

// StartRedis starts a Redis for t, with args added to its command line
// (TLS, a password); t's cleanup stops it.
func StartRedis(t testing.TB, args ...string) *Redis {
	t.Helper()
	bin := RedisServer(t)
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	r := &Redis{bin: bin, dir: t.TempDir(), port: port, args: args}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop() })
	return r
}

// Addr is host:port.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Start starts the server (again, after Stop: empty) and waits until it
// answers PING.
func (r *Redis) Start() error {
	var args []string
	if r.conf != "" {
		args = []string{r.conf}
	}
	p, err := Start("redis", r.bin, append(append(args,
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--loglevel", "warning",
	), r.args...), nil)
	if err != nil {
		return err
	}
	r.proc = p
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Any answer will do: with a password it is NOAUTH.
		var refused *RedisError
		if _, err := r.Do("PING"); err == nil || errors.As(err, &refused) {
			return nil
		} else if time.Now().After(deadline) || p.Exited() {
			_ = p.Stop()
			return fmt.Errorf("redis-server on %s did not answer: %v\n%s", r.Addr(), err, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server: its data is gone.
func (r *Redis) Stop() error {
	if r.proc == nil {
		return nil
	}
	_ = r.proc.Signal(syscall.SIGCONT) // a paused server cannot exit
	err := r.proc.Stop()
	r.proc = nil
	return err
}

// Pause stops the server answering without closing its connections, as a
// Redis stalled by a long command or a full disk does; Resume undoes it.
func (r *Redis) Pause() error  { return r.proc.Signal(syscall.SIGSTOP) }
func (r *Redis) Resume() error { return r.proc.Signal(syscall.SIGCONT) }

// Do sends one command on a new connection and returns its reply as text:
// for what a test asks of Redis itself (INFO, MEMORY USAGE, a forged
// record), with no client library between.
func (r *Redis) Do(args ...string) (string, error) { return redisDo(r.Addr(), args...) }

// redisDo sends one command to the Redis at addr on a new connection.
func redisDo(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}

// RedisError is an error reply: Redis answered, and refused.
type RedisError struct{ Reply string }

func (e *RedisError) Error() string { return "redis: " + e.Reply }

// readReply reads one RESP2 reply; an array's elements are joined by
// newlines.
func readReply(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("redis: empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", &RedisError{Reply: line[1:]}
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err // a nil bulk string reads as ""
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		var parts []string
		for range n {
			p, err := readReply(br)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("redis: unexpected reply %q", line)
}

// UsedMemory is the server's used_memory (INFO memory), in bytes:
// everything it holds, with its own overhead.
func (r *Redis) UsedMemory() (int64, error) {
	info, err := r.Do("INFO", "memory")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("redis %s: INFO memory has no used_memory:\n%s", r.Addr(), info)
}

// MemoryUsage is MEMORY USAGE of key, in bytes: the key, its value and
// their overhead. A key the server does not hold is an error.
func (r *Redis) MemoryUsage(key string) (int64, error) {
	got, err := r.Do("MEMORY", "USAGE", key)
	if err != nil {
		return 0, err
	}
	if got == "" {
		return 0, fmt.Errorf("redis %s holds no key %s", r.Addr(), key)
	}
	return strconv.ParseInt(got, 10, 64)
}
