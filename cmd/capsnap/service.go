package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/checkcodec"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/extauthz"
	"github.com/capsnap/capsnap/extproc"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/tracing"
)

// service is capsnap serve's whole running process, built from a
// configuration (newService): the decision core and its two Envoy
// adapters on one gRPC server, the catalog, the stores, the admin and
// approval listeners, and what watches the policy, the keys and the
// response path. run serves until its context ends; close releases what
// newService opened, in reverse.
type service struct {
	cfg   config.Config
	log   zerolog.Logger
	keys  *envelope.Keys
	rules *decide.Rules
	hop   *hop
	cat   *catalog.Catalog
	srv   *decide.Server

	approvals      *approval.Service
	approvalServer *http.Server

	gs    *grpc.Server
	hs    *health.Server
	admin *http.Server
	// The listeners, bound by newService: an address of port 0 is
	// known before run.
	grpcLis, adminLis, approvalLis net.Listener

	// closers release what newService opened, last first.
	closers []func()
}

// newService builds the running service from cfg: the audit trail on
// stdout unless audit.path, the log on stderr. On an error, what it had
// opened is released.
func newService(cfg config.Config, stdout, stderr io.Writer) (_ *service, err error) {
	s := &service{cfg: cfg, log: newLogger(cfg.Log, stderr)}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	// Every file the configuration names, read and checked as check
	// checks it; the catalog's list_changed counts go to the catalog
	// built on its sources below.
	set, err := loadSetup(cfg, s.log, true, func(id string) { s.cat.NoteListChanged(id) })
	if err != nil {
		return nil, err
	}
	s.keys, s.rules, s.hop = set.keys, set.rules, set.hop
	// The audit trail (audit.go): group commit, chained, its checkpoints
	// signed with the envelope keys; closed last, after every decision.
	auditLog, closeAudit, err := openAudit(cfg.Audit, stdout, s.keys, s.log)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, closeAudit)
	s.warn()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.cat = catalog.New(set.sources, catalog.Options{Logger: s.log, OnChange: func(id string, prev, next *catalog.List, changed []string) {
		s.srv.CatalogChanged(id, prev, next, changed)
	}})
	reg.MustRegister(s.cat)
	store, err := openStore(cfg, set.redis, s.log, auditLog, reg)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, store.close)
	if s.approvals, s.approvalServer, err = openApprovals(cfg, set.auth, store, auditLog, s.log, reg); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	if s.approvals != nil {
		s.closers = append(s.closers, s.approvals.Close)
	}
	s.srv, err = decide.New(decide.Options{
		Approvals:        s.approvals,
		Catalog:          s.cat,
		Servers:          s.cat.Servers(),
		Rules:            s.rules,
		Denials:          cfg.Denials,
		Snapshots:        store.Backend,
		ListingKey:       store.listingKey,
		SnapshotTTL:      cfg.Snapshots.TTL,
		Bind:             cfg.Discovery.Bind,
		MaxResponseBytes: cfg.Discovery.MaxResponseBytes,
		Freshness:        cfg.Catalog,
		Principal:        cfg.Principal,
		Limits:           mcpparse.Limits{MaxBodyBytes: cfg.Limits.MaxBodyBytes, MaxDepth: cfg.Limits.MaxDepth},
		Observe:          cfg.Observed(),
		ReleaseOnError:   cfg.ReleasingOnError(),
		WithoutListing:   cfg.CallingWithoutListing(),
		Audit:            auditLog,
		Metrics:          decide.NewMetrics(reg),
		Envelope:         s.keys,
		EnvelopeTTL:      cfg.Envelope.TTL,
		Grants:           set.grants,
	})
	if err != nil {
		return nil, err
	}

	tracer, stopTracing, err := tracing.New(context.Background(), cfg.Tracing, versionString())
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	s.closers = append(s.closers, func() {
		// Spans still batched go out before exit, within a bound.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := stopTracing(ctx); err != nil {
			s.log.Warn().Err(err).Msg("tracing: spans not exported at shutdown")
		}
	})

	// A tools/list response reaches ext_proc whole, in one message. A
	// CheckRequest is decoded into only what the decision reads
	// (checkcodec); every other message as gRPC decodes it.
	s.gs = grpc.NewServer(append(s.hop.grpcOptions(),
		grpc.MaxRecvMsgSize(max(cfg.Discovery.MaxResponseBytes, cfg.Limits.MaxBodyBytes)+64<<10),
		grpc.ForceServerCodecV2(checkcodec.Codec{}),
		grpc.NumStreamWorkers(streamWorkers))...)
	authv3.RegisterAuthorizationServer(s.gs, extauthz.New(s.srv, tracer))
	extprocv3.RegisterExternalProcessorServer(s.gs, extproc.New(s.srv, tracer))
	// NOT_SERVING until ready (health.NewServer starts "" SERVING): an
	// Envoy that health-checks its replicas sends a starting one no Check
	// before it can decide them.
	s.hs = health.NewServer()
	for _, svc := range healthServices {
		s.hs.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	healthpb.RegisterHealthServer(s.gs, s.hs)
	mux := adminMux(s.cat, reg, s.srv, cfg.PolicyFile, cfg.Debug.Pprof, s.log)
	serveJWKS(mux, s.keys)
	serveBudgets(mux, s.srv, s.log)
	s.admin = &http.Server{Handler: s.hop.guardAdmin(mux), ReadHeaderTimeout: 5 * time.Second}
	return s, s.listen()
}

// warn says at start what an operator must know of the configuration.
func (s *service) warn() {
	if observed := s.cfg.Observed(); len(observed) > 0 {
		s.log.Warn().Strs("servers", observed).
			Msg("OBSERVE MODE: capsnap decides, audits and counts every request to these servers and enforces nothing: a request it would deny passes, and a tools/list response reaches the agent unfiltered")
	}
	if ids := s.cfg.CallingWithoutListing(); len(ids) > 0 {
		s.log.Warn().Strs("servers", ids).
			Msg("calls_without_listing: a caller with no snapshot on these servers may call their tools, held to the live, approved definition rather than one it was delivered")
	}
	if s.cfg.Principal.Source == config.SourceHeader {
		s.log.Warn().Str("header", s.cfg.Principal.Header).
			Msg("INSECURE: principal taken from a client-supplied header; Envoy must strip it from clients. Development only.")
	}
}

// listen binds the gRPC, admin and approval listeners.
func (s *service) listen() error {
	var err error
	if s.grpcLis, err = net.Listen("tcp", s.cfg.GRPCAddr); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	s.closers = append(s.closers, func() { s.grpcLis.Close() })
	if s.adminLis, err = net.Listen("tcp", s.cfg.AdminAddr); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	s.closers = append(s.closers, func() { s.adminLis.Close() })
	if s.approvalServer != nil {
		if s.approvalLis, err = net.Listen("tcp", s.cfg.Approvals.Addr); err != nil {
			return fmt.Errorf("serve: approvals: %w", err)
		}
		s.closers = append(s.closers, func() { s.approvalLis.Close() })
	}
	return nil
}

// close releases what newService opened, last first: the audit trail
// closes after every decision.
func (s *service) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// run serves until ctx ends (or a part of the service fails), then shuts
// down: NOT_SERVING, the drain, the in-flight Checks.
func (s *service) run(ctx context.Context) error {
	cfg, log := s.cfg, s.log
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.cat.Run(ctx) })
	g.Go(func() error { s.hop.run(ctx); return nil })
	g.Go(func() error { return s.gs.Serve(s.grpcLis) })
	g.Go(func() error { return served(s.admin.Serve(s.adminLis)) })
	if s.approvalServer != nil {
		g.Go(func() error { s.approvals.Run(ctx, 5*time.Second); return nil })
		g.Go(func() error { return served(s.approvalServer.Serve(s.approvalLis)) })
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
			defer cancel()
			return s.approvalServer.Shutdown(sctx)
		})
		log.Info().Str("addr", cfg.Approvals.Addr).Str("url", s.approvals.URL("")).Msg("approvals served")
	}
	g.Go(func() error { reloadOnHUP(ctx, cfg.PolicyFile, s.srv, log); return nil })
	g.Go(func() error { s.srv.WatchPolicy(ctx, cfg.PolicyFile, cfg.PolicyPoll, log); return nil })
	g.Go(func() error { watchKeys(ctx, s.keys, cfg.Envelope.KeyPoll, log); return nil }) // envelope.go
	g.Go(func() error { s.srv.WatchResponsePath(ctx, log); return nil })
	g.Go(func() error { return s.shutdown(ctx) })
	g.Go(func() error { s.ready(ctx); return nil })
	log.Info().Str("grpc_addr", cfg.GRPCAddr).Str("admin_addr", cfg.AdminAddr).
		Str("policy_digest", s.rules.Policy.Digest()).Str("version", versionString()).Msg("capsnap serving")
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// served is an HTTP server's Serve error, nil once it was shut down.
func served(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// shutdown waits for ctx to end, then stops the service: NOT_SERVING
// first, the drain, the in-flight Checks within shutdownGrace, the admin
// listener.
func (s *service) shutdown(ctx context.Context) error {
	<-ctx.Done()
	s.hs.Shutdown()
	if s.cfg.Drain > 0 {
		// NOT_SERVING first: Envoy's health check moves new Checks to
		// the other replicas before this one stops taking them.
		s.log.Info().Int64("drain_ms", s.cfg.Drain.Milliseconds()).Msg("shutting down: draining")
		time.Sleep(s.cfg.Drain)
	}
	s.log.Info().Msg("shutting down: finishing in-flight checks")
	done := make(chan struct{})
	go func() { s.gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(shutdownGrace):
		s.gs.Stop()
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	return s.admin.Shutdown(sctx)
}

// ready turns the health services SERVING once the decision is ready.
func (s *service) ready(ctx context.Context) {
	for s.srv.Ready() != nil {
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	for _, svc := range healthServices {
		s.hs.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
}
