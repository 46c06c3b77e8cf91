package config

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestLoadInvalid(t *testing.T) {
	f, err := os.Open("testdata/invalid/want.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, want, _ := strings.Cut(sc.Text(), "\t")
		seen++
		t.Run(name, func(t *testing.T) {
			_, err := Load(filepath.Join("testdata/invalid", name+".yaml"))
			if err == nil {
				t.Fatalf("Load succeeded, want error containing %q", want)
			}
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not contain %q", err, want)
			}
		})
	}
	files, _ := filepath.Glob("testdata/invalid/*.yaml")
	if seen != len(files) {
		t.Fatalf("want.txt lists %d cases, testdata/invalid has %d files", seen, len(files))
	}
}

func TestLoadValid(t *testing.T) {
	c, err := Load("testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := filepath.Abs("testdata")
	if c.PolicyFile != filepath.Join("testdata", "policy.yaml") && c.PolicyFile != filepath.Join(dir, "policy.yaml") {
		t.Errorf("policy_file = %q, want it relative to the config's directory", c.PolicyFile)
	}
	if got := c.Servers[1].CatalogFile; got != filepath.Join("testdata", "files-catalog.json") {
		t.Errorf("catalog_file = %q, want it relative to the config's directory", got)
	}
	d := Default()
	if c.GRPCAddr != d.GRPCAddr || c.AdminAddr != d.AdminAddr || c.Limits != d.Limits {
		t.Errorf("defaults not applied: %+v", c)
	}
	if c.Principal.JWT.MetadataNamespace != "envoy.filters.http.jwt_authn" || c.Principal.JWT.PayloadKey != "verified" {
		t.Errorf("jwt defaults not merged with the file: %+v", c.Principal.JWT)
	}
	if s := c.Servers[0]; s.Resync != 30*time.Second || s.ProtocolVersion != "2025-11-25" {
		t.Errorf("server defaults not applied: %+v", s)
	}
	if c.Servers[1].ProtocolVersion != "" {
		t.Errorf("a catalog file has no protocol version, got %q", c.Servers[1].ProtocolVersion)
	}
}

func TestRedisSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) Redis {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return Redis{SecretFile: p}
	}
	key := strings.Repeat("k", MinSecretBytes)
	if b, err := write("ok", key+"\n").ReadSecret(); err != nil || string(b) != key {
		t.Errorf("ReadSecret = %q, %v; want the key without its newline", b, err)
	}
	if _, err := write("short", key[1:]+"\n").ReadSecret(); err == nil || !strings.Contains(err.Error(), "fewer than 32") {
		t.Errorf("a 31-byte secret: %v", err)
	}
	if _, err := (Redis{SecretFile: filepath.Join(dir, "none")}).ReadSecret(); err == nil || !strings.Contains(err.Error(), "snapshots.redis.secret_file") {
		t.Errorf("a missing secret file: %v", err)
	}
}

// A server's own mode wins; with none, the top-level mode applies.
func TestObserved(t *testing.T) {
	servers := func(modes ...string) []Server {
		var out []Server
		for i, m := range modes {
			out = append(out, Server{ID: fmt.Sprintf("s%d", i), Mode: m})
		}
		return out
	}
	for _, tt := range []struct {
		name string
		mode string
		srv  []Server
		want []string
	}{
		{"enforce everywhere", ModeEnforce, servers("", ModeEnforce), nil},
		{"observe everywhere", ModeObserve, servers("", ""), []string{"s0", "s1"}},
		{"one server observed", ModeEnforce, servers("", ModeObserve), []string{"s1"}},
		{"one server enforced", ModeObserve, servers(ModeEnforce, ""), []string{"s1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Mode, c.Servers = tt.mode, tt.srv
			if got := c.Observed(); !slices.Equal(got, tt.want) {
				t.Errorf("Observed() = %v, want %v", got, tt.want)
			}
		})
	}
}
