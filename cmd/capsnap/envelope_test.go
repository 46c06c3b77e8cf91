package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/testbed"
)

// newKey writes a new Ed25519 key to file, and returns its kid.
func newKey(t *testing.T, file string) string {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := envelope.LoadKeys(file)
	if err != nil {
		t.Fatal(err)
	}
	return k.KeyID()
}

// published are the kids the JWKS endpoint at url serves now.
func published(t *testing.T, url string) []string {
	t.Helper()
	resp, err := http.Get(url + "/.well-known/jwks.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var set struct {
		Keys []struct {
			Kid string `json:"kid"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(body, &set); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	var out []string
	for _, k := range set.Keys {
		out = append(out, k.Kid)
	}
	return out
}

// The envelope key replaced on disk while capsnap runs, as serve watches
// it: the admin listener's JWKS publishes the new key beside the old
// before the new one signs, the old one goes on signing until
// publish_ahead has passed, then the new one signs and the old stays
// published. Once by the poll, once by SIGHUP.
func TestKeyRotationThroughTheJWKSEndpoint(t *testing.T) {
	// SIGHUP never ends this test process, whenever it comes.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	for _, tc := range []struct {
		name string
		poll time.Duration
		sigs bool
	}{
		{"file change", 50 * time.Millisecond, false},
		{"SIGHUP", time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "envelope.pem")
			oldKid := newKey(t, file)
			cfg := config.Default()
			cfg.Envelope.KeyFiles = []string{file}
			cfg.Envelope.PublishAhead = 2 * time.Second
			keys, err := envelopeKeys(cfg)
			if err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			serveJWKS(mux, keys)
			srv := httptest.NewServer(mux)
			defer srv.Close()
			logs := &testbed.SyncBuffer{}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { watchKeys(ctx, keys, tc.poll, zerolog.New(logs)); close(done) }()
			defer func() { cancel(); <-done }()

			if got := published(t, srv.URL); !slices.Equal(got, []string{oldKid}) {
				t.Fatalf("published %v, want the one key %s", got, oldKid)
			}
			newKid := newKey(t, file)
			start := time.Now()
			var got []string
			for !slices.Equal(got, []string{newKid, oldKid}) {
				if time.Since(start) > 5*time.Second {
					t.Fatalf("published %v after 5s, want the new key and the old", got)
				}
				if tc.sigs {
					_ = syscall.Kill(os.Getpid(), syscall.SIGHUP)
				}
				time.Sleep(20 * time.Millisecond)
				got = published(t, srv.URL)
			}
			if signer := keys.KeyID(); signer != oldKid {
				t.Fatalf("the new key signs %v after it was published, before publish_ahead", time.Since(start))
			}
			for keys.KeyID() != newKid {
				if time.Since(start) > 10*time.Second {
					t.Fatal("the new key does not sign 10s after it was published, with a publish_ahead of 2s")
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("the new key published, then signing after %v", time.Since(start))
			if got := published(t, srv.URL); !slices.Equal(got, []string{newKid, oldKid}) {
				t.Fatalf("published %v once the new key signs, want the old kept until what it signed expired (%v)", got, cfg.Outlive())
			}
			if !strings.Contains(logs.String(), "envelope keys changed") {
				t.Errorf("no log of the rotation:\n%s", logs.String())
			}
		})
	}
}
