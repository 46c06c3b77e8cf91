package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// grpc_tls and admin: paths relative to the config file, defaults for what
// the file leaves out.
func TestLoadAccess(t *testing.T) {
	c, err := Load("testdata/access.yaml")
	if err != nil {
		t.Fatal(err)
	}
	g := c.GRPCTLS
	if !g.Enabled() {
		t.Fatal("grpc_tls is set but not enabled")
	}
	for _, f := range []struct{ name, got, want string }{
		{"cert_file", g.CertFile, filepath.Join("testdata", "tls", "capsnap.pem")},
		{"key_file", g.KeyFile, filepath.Join("testdata", "tls", "capsnap-key.pem")},
		{"client_ca_file", g.ClientCAFile, "/etc/capsnap/tls/ca.pem"},
		{"admin.token_file", c.Admin.TokenFile, filepath.Join("testdata", "admin.token")},
		{"allowed_clients[1]", g.AllowedClients[1], "dns:envoy.mcp.svc.cluster.local"},
	} {
		if f.got != f.want {
			t.Errorf("%s = %q, want %q", f.name, f.got, f.want)
		}
	}
	if g.ReloadInterval != 10*time.Second || g.MaxConnectionAge != 10*time.Minute {
		t.Errorf("defaults not applied: reload_interval %s, max_connection_age %s", g.ReloadInterval, g.MaxConnectionAge)
	}
	if Default().GRPCTLS.Enabled() || Default().Admin.TokenFile != "" {
		t.Error("the defaults turn grpc_tls or the admin token on")
	}
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9002": true,
		"127.0.0.9:9002": true,
		"[::1]:9002":     true,
		"localhost:9002": true,
		"0.0.0.0:9002":   false,
		":9002":          false,
		"[::]:9002":      false,
		"10.0.0.7:9002":  false,
		"capsnap:9002":   false,
		"nonsense":       false,
	} {
		if got := Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) Admin {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return Admin{TokenFile: p}
	}
	tok := strings.Repeat("t", MinTokenBytes)
	if b, err := write("ok", tok+"\n").ReadToken(); err != nil || string(b) != tok {
		t.Errorf("ReadToken = %q, %v; want the token without its newline", b, err)
	}
	if _, err := write("short", tok[1:]).ReadToken(); err == nil || !strings.Contains(err.Error(), "admin.token_file: ") || !strings.Contains(err.Error(), "fewer than 32") {
		t.Errorf("a 31-byte token: %v", err)
	}
	if _, err := write("spaced", tok+" "+tok).ReadToken(); err == nil || !strings.Contains(err.Error(), "cannot go in a header") {
		t.Errorf("a token with a space: %v", err)
	}
	if _, err := (Admin{TokenFile: filepath.Join(dir, "none")}).ReadToken(); err == nil || !strings.Contains(err.Error(), "admin.token_file") {
		t.Errorf("a missing token file: %v", err)
	}
}
