package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/envelope"
)

// envelopeKeys loads the keys envelope.key_files names, as a ring that
// rotates (watchKeys); nil when there are none, and capsnap then sends no
// envelope.
func envelopeKeys(cfg config.Config) (*envelope.Keys, error) {
	if len(cfg.Envelope.KeyFiles) == 0 {
		return nil, nil
	}
	k, err := envelope.OpenKeys(envelope.KeyOptions{PublishAhead: cfg.Envelope.PublishAhead, Outlive: cfg.Outlive()}, cfg.Envelope.KeyFiles...)
	if err != nil {
		return nil, fmt.Errorf("envelope.key_files: %w", err)
	}
	return k, nil
}

// watchKeys reads the envelope key files every envelope.key_poll_interval
// and on SIGHUP, rotating the keys as they change, and logs the ring
// whenever it changes: a key published, taking over, retired. A file
// that cannot be read leaves the ring as it was, and is logged once until
// it can.
func watchKeys(ctx context.Context, keys *envelope.Keys, poll time.Duration, log zerolog.Logger) {
	if keys == nil {
		return
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	t := time.NewTicker(poll)
	defer t.Stop()
	last, failing := keys.Status(), ""
	log.Info().Interface("keys", last).Msg("envelope keys")
	for {
		trigger := "file change"
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-hup:
			trigger = "SIGHUP"
		}
		if _, err := keys.Reload(); err != nil {
			if err.Error() != failing {
				log.Error().Err(err).Str("trigger", trigger).Msg("envelope keys not reloaded; the keys in force stay")
			}
			failing = err.Error()
			continue
		}
		failing = ""
		if now := keys.Status(); !slices.Equal(now, last) {
			log.Info().Str("trigger", trigger).Interface("keys", now).Msg("envelope keys changed")
			last = now
		}
	}
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
	mux.HandleFunc("GET /.well-known/jwks.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Header().Set("Cache-Control", "max-age=60")
		_, _ = w.Write(keys.JWKS())
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
