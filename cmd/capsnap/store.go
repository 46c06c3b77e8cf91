package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/redis"
)

// backend is the store of record the configuration names (the approval
// requests in it), and the key of the listing tickets: random per
// process for the memory store, derived from the shared secret for Redis,
// whose replicas must open each other's.
type backend struct {
	store.Backend
	listingKey []byte
	close      func()
}

func openStore(cfg config.Config, ro *redis.Options, log, auditLog zerolog.Logger, reg prometheus.Registerer) (*backend, error) {
	if cfg.Snapshots.Store != config.StoreRedis {
		m, err := store.NewMemory(store.MemoryOptions{MaxSnapshots: cfg.Snapshots.MaxSnapshots, Retain: cfg.Snapshots.TTL})
		if err != nil {
			return nil, err
		}
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "capsnap", Name: "snapshots_active",
			Help: "Snapshots held in memory, including expired ones kept to answer snapshot_expired.",
		}, func() float64 { return float64(m.Held()) }))
		return &backend{Backend: m, close: m.Close}, nil
	}
	o := *ro
	o.Retain, o.MaxLocal = cfg.Snapshots.TTL, cfg.Snapshots.MaxSnapshots
	o.Log, o.Audit, o.Registerer = log.With().Str("store", "redis").Logger(), auditLog, reg
	r, err := redis.Open(o)
	if err != nil {
		return nil, fmt.Errorf("snapshots.redis: %w", err)
	}
	mac := hmac.New(sha256.New, o.Secret)
	mac.Write([]byte("capsnap listing ticket key v1"))
	return &backend{Backend: r, listingKey: mac.Sum(nil), close: r.Close}, nil
}

// redisOptions reads what the Redis store needs from files: the secret,
// the password, the TLS material. `capsnap check` reads them too.
func redisOptions(rc config.Redis) (redis.Options, error) {
	o := redis.Options{Addr: rc.Addr, Cluster: rc.Cluster.Addrs, Username: rc.Username, DB: rc.DB, KeyPrefix: rc.KeyPrefix,
		Timeout: rc.Timeout, ProbeInterval: rc.ProbeInterval,
		Sentinel: redis.Sentinel{MasterSet: rc.Sentinel.MasterSet, Addrs: rc.Sentinel.Addrs, Username: rc.Sentinel.Username}}
	var err error
	if o.Secret, err = rc.ReadSecret(); err != nil {
		return o, err
	}
	if o.Password, err = rc.ReadPassword(); err != nil {
		return o, err
	}
	if o.Sentinel.Password, err = rc.Sentinel.ReadPassword(); err != nil {
		return o, err
	}
	if rc.TLS.CAFile == "" {
		return o, nil
	}
	pem, err := os.ReadFile(rc.TLS.CAFile)
	if err != nil {
		return o, fmt.Errorf("snapshots.redis.tls.ca_file: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return o, fmt.Errorf("snapshots.redis.tls.ca_file: %s holds no PEM certificate", rc.TLS.CAFile)
	}
	o.TLS = &tls.Config{RootCAs: roots, ServerName: rc.TLS.ServerName, MinVersion: tls.VersionTLS12}
	if rc.TLS.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(rc.TLS.CertFile, rc.TLS.KeyFile)
		if err != nil {
			return o, fmt.Errorf("snapshots.redis.tls: %w", err)
		}
		o.TLS.Certificates = []tls.Certificate{cert}
	}
	return o, nil
}
