package main

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/redis"
	"github.com/capsnap/capsnap/testbed"
)

// snapshots.redis's password_file and tls reach a real Redis that requires
// both, with a client certificate: what serve builds from the config
// connects, and each thing missing or wrong leaves the store unavailable.
func TestRedisTLSAndPassword(t *testing.T) {
	testbed.RedisServer(t)
	dir := t.TempDir()
	pki, err := testbed.NewPKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.ClientCert("spiffe://acme/capsnap")
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"client.pem":     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}),
		"client-key.pem": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		"snapshot.key":   []byte("0123456789abcdef0123456789abcdef\n"),
		"password":       []byte("s3cret\n"),
		"wrong-password": []byte("guess\n"),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tlsPort, err := testbed.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	testbed.StartRedis(t, "--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", filepath.Join(dir, testbed.ServerCertFile), "--tls-key-file", filepath.Join(dir, testbed.ServerKeyFile),
		"--tls-ca-cert-file", filepath.Join(dir, testbed.CAFile), "--tls-auth-clients", "yes", "--requirepass", "s3cret")

	full := config.Redis{
		Addr: "127.0.0.1:" + strconv.Itoa(tlsPort), SecretFile: filepath.Join(dir, "snapshot.key"),
		PasswordFile: filepath.Join(dir, "password"), KeyPrefix: "capsnap:",
		TLS: config.RedisTLS{CAFile: filepath.Join(dir, testbed.CAFile), CertFile: filepath.Join(dir, "client.pem"),
			KeyFile: filepath.Join(dir, "client-key.pem"), ServerName: "localhost"},
	}
	tests := []struct {
		name string
		edit func(*config.Redis)
		ok   bool
	}{
		{"tls, client certificate and password", func(*config.Redis) {}, true},
		{"no client certificate", func(r *config.Redis) { r.TLS.CertFile, r.TLS.KeyFile = "", "" }, false},
		{"wrong password", func(r *config.Redis) { r.PasswordFile = filepath.Join(dir, "wrong-password") }, false},
		{"no password", func(r *config.Redis) { r.PasswordFile = "" }, false},
		{"plaintext to the TLS port", func(r *config.Redis) { r.TLS = config.RedisTLS{} }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := full
			tt.edit(&rc)
			o, err := redisOptions(rc)
			if err != nil {
				t.Fatal(err)
			}
			o.Timeout, o.ProbeInterval, o.MaxLocal = 300*time.Millisecond, 50*time.Millisecond, 10
			s, err := redis.Open(o)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			// Long enough for several probes to connect, or to fail to.
			wait := time.Second
			if tt.ok {
				wait = 5 * time.Second
			}
			deadline := time.Now().Add(wait)
			for {
				_, err = s.Seq()
				if err == nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			switch {
			case tt.ok && err != nil:
				t.Fatalf("the store did not become available: %v", err)
			case !tt.ok && !errors.Is(err, store.ErrUnavailable):
				t.Fatalf("Seq = %v, want the store unavailable", err)
			case !tt.ok:
				t.Logf("refused, as it should be: %v", err)
			}
		})
	}
}

// snapshots.redis.cluster reaches a real Redis Cluster through the
// configuration file, and snapshots.redis.sentinel's settings and its
// password file reach the store's options.
func TestRedisClusterAndSentinelFromConfig(t *testing.T) {
	testbed.RedisServer(t)
	c := testbed.StartRedisCluster(t, 3)
	dir := t.TempDir()
	for name, content := range map[string]string{
		"snapshot.key":      "0123456789abcdef0123456789abcdef\n",
		"sentinel-password": "s3ntinel\n",
		"policy.yaml":       "",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	load := func(redisYAML string) config.Redis {
		t.Helper()
		path := filepath.Join(dir, "capsnap.yaml")
		doc := "policy_file: policy.yaml\nservers: [{id: billing, url: \"http://127.0.0.1:1/mcp\"}]\n" +
			"snapshots: {store: redis, redis: " + redisYAML + "}\n"
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Snapshots.Redis
	}

	o, err := redisOptions(load(`{cluster: {addrs: ["` + strings.Join(c.Addrs()[:2], `", "`) + `"]}, secret_file: snapshot.key}`))
	if err != nil {
		t.Fatal(err)
	}
	o.Timeout, o.ProbeInterval, o.MaxLocal = 300*time.Millisecond, 50*time.Millisecond, 10
	s, err := redis.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	deadline := time.Now().Add(5 * time.Second)
	for _, err := s.Seq(); err != nil; _, err = s.Seq() {
		if time.Now().After(deadline) {
			t.Fatalf("the store on the cluster did not become available: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	o, err = redisOptions(load(`{sentinel: {master_set: mymaster, addrs: ["127.0.0.1:26379", "127.0.0.1:26380"], username: capsnap, password_file: sentinel-password}, secret_file: snapshot.key}`))
	if err != nil {
		t.Fatal(err)
	}
	want := redis.Sentinel{MasterSet: "mymaster", Addrs: []string{"127.0.0.1:26379", "127.0.0.1:26380"}, Username: "capsnap", Password: "s3ntinel"}
	if o.Addr != "" || o.Cluster != nil || !reflect.DeepEqual(o.Sentinel, want) {
		t.Fatalf("sentinel options = %+v, want %+v", o, want)
	}
}
