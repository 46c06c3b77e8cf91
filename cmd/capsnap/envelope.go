package main

import (
	"fmt"
	"io"
	"net/http"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/envelope"
)

// envelopeKeys loads the keys envelope.key_files names; nil when there are
// none, and capsnap then sends no envelope.
func envelopeKeys(cfg config.Config) (*envelope.Keys, error) {
	if len(cfg.Envelope.KeyFiles) == 0 {
		return nil, nil
	}
	k, err := envelope.LoadKeys(cfg.Envelope.KeyFiles...)
	if err != nil {
		return nil, fmt.Errorf("envelope.key_files: %w", err)
	}
	return k, nil
}

// grantKeys loads the grant keys of the servers that have one, by
// server_id.
func grantKeys(cfg config.Config) (map[string]*envelope.Recipient, error) {
	out := map[string]*envelope.Recipient{}
	for i, s := range cfg.Servers {
		if s.GrantKeyFile == "" {
			continue
		}
		r, err := envelope.LoadRecipient(s.GrantKeyFile)
		if err != nil {
			return nil, fmt.Errorf("servers[%d].grant_key_file: %w", i, err)
		}
		out[s.ID] = r
	}
	return out, nil
}

// serveJWKS publishes the envelope keys' public halves, where verifiers
// (pincheck's JWKS URL, verifiers/) fetch them. Public keys: no secret is
// served, so the endpoint needs no protection beyond the admin listener's.
func serveJWKS(mux *http.ServeMux, keys *envelope.Keys) {
	if keys == nil {
		return
	}
	jwks := keys.JWKS()
	mux.HandleFunc("GET /.well-known/jwks.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Header().Set("Cache-Control", "max-age=60")
		_, _ = w.Write(jwks)
	})
}

// keysJWKS prints the JWKS of the envelope keys the configuration at path
// names: what to hand the MCP servers' verifiers.
func keysJWKS(path string, stdout io.Writer) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	keys, err := envelopeKeys(cfg)
	if err != nil {
		return err
	}
	if keys == nil {
		return fmt.Errorf("keys jwks: %s names no envelope.key_files", path)
	}
	_, err = fmt.Fprintf(stdout, "%s\n", keys.JWKS())
	return err
}
