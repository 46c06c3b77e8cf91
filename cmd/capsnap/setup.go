package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/store/redis"
)

// setup is everything serve reads from the files a configuration names,
// and checks against each other, before it opens a store or a listener.
// loadSetup is the one loader: check calls it as serve does, so check
// refuses exactly what serve refuses.
type setup struct {
	keys    *envelope.Keys
	grants  map[string]*envelope.Recipient
	rules   *decide.Rules
	hop     *hop
	sources map[string]catalog.Source
	// auth is how approvers prove who they are; nil with approvals off,
	// or when a JWKS URL was not to be fetched.
	auth approval.Authenticator
	// redis is the store's connection, with snapshots.store redis.
	redis *redis.Options
}

// loadSetup loads and cross-checks what cfg names. remote is whether it
// may ask the network (an approvers' JWKS URL): serve's loader does, and
// check's only with --connect. listChanged, if set, hears every
// list_changed of a server's catalog session.
func loadSetup(cfg config.Config, log zerolog.Logger, remote bool, listChanged func(serverID string)) (*setup, error) {
	s := &setup{}
	var err error
	if s.keys, err = envelopeKeys(cfg); err != nil {
		return nil, err
	}
	if s.grants, err = grantKeys(cfg); err != nil {
		return nil, err
	}
	if s.rules, err = decide.LoadRules(cfg.PolicyFile); err != nil {
		return nil, err
	}
	if err := s.rules.ServedBy(cfg.ServerIDs()); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.PolicyFile, err)
	}
	if err := approvalsFor(cfg, s.rules.Policy); err != nil {
		return nil, err
	}
	if a := cfg.Approvals; a.Addr != "" && (a.Auth.JWKSURL == "" || remote) {
		if s.auth, err = approverAuth(a, log); err != nil {
			return nil, err
		}
	}
	if cfg.Snapshots.Store == config.StoreRedis {
		o, err := redisOptions(cfg.Snapshots.Redis)
		if err != nil {
			return nil, err
		}
		s.redis = &o
	}
	// The trail itself is opened (and resumed) by serve alone; a
	// directory that is not there refuses both.
	if p := cfg.Audit.Path; p != "" {
		if _, err := os.Stat(filepath.Dir(p)); err != nil {
			return nil, fmt.Errorf("audit.path: %w", err)
		}
	}
	if s.hop, err = newHop(cfg, log); err != nil {
		return nil, err
	}
	// Last: a catalog file is read here, so that a bad one stops the
	// binary at start instead of leaving a server unavailable.
	if s.sources, err = sources(cfg, log, listChanged); err != nil {
		return nil, err
	}
	return s, nil
}

// reachStore opens the shared store, waits for it to answer and closes
// it: check --connect's proof that a replica would reach it.
func reachStore(cfg config.Config, o redis.Options, timeout time.Duration) error {
	o.Retain, o.MaxLocal = cfg.Snapshots.TTL, cfg.Snapshots.MaxSnapshots
	o.Log, o.Audit, o.Registerer = zerolog.Nop(), zerolog.Nop(), prometheus.NewRegistry()
	r, err := redis.Open(o)
	if err != nil {
		return fmt.Errorf("snapshots.redis: %w", err)
	}
	defer r.Close()
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		_, err := r.Seq()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("snapshots.redis: not reached within %s: %w", timeout, err)
		}
	}
}
