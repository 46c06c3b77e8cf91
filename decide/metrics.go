package decide

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/internal/bounded"
	"github.com/capsnap/capsnap/policy"
)

// Metrics are the decision metrics. Every label value is bounded: decision
// and reason come from closed sets, server_id from the configuration (any
// other is reported as "unknown"), effect_class from the four classes.
// Principals, tools, epochs and arguments are never labels.
type Metrics struct {
	decisions *prometheus.CounterVec
	// counters holds each decisions series by its decisionLabels, once
	// used: WithLabelValues hashes and validates four labels under a
	// read lock that every Check shares, a fifth of a decision's CPU on a
	// busy server.
	counters bounded.Map[decisionLabels, prometheus.Counter]
	latency  prometheus.Histogram
	reloads  *prometheus.CounterVec
	policy   *prometheus.GaugeVec
	minted   *prometheus.CounterVec
	invalid  *prometheus.CounterVec
	// hits and misses are snapshot_lookups_total's two series.
	hits, misses prometheus.Counter
	// deliveries and withheld count the response path; unbound the
	// listings whose response never came back through it.
	deliveries, withheld, unbound *prometheus.CounterVec
	// limits counts budgets' and rate limits' reservations and refusals.
	limits *prometheus.CounterVec
}

type decisionLabels struct{ decision, reason, serverID, effect, mode string }

// decided counts one decision.
func (m *Metrics) decided(l decisionLabels) {
	// The labels are bounded; so is this, should that ever change.
	m.counters.Get(l, 1<<14, func() (decisionLabels, prometheus.Counter) {
		kept := decisionLabels{l.decision, l.reason, strings.Clone(l.serverID), l.effect, l.mode}
		return kept, m.decisions.WithLabelValues(l.decision, l.reason, l.serverID, l.effect, l.mode)
	}).Inc()
}

// NewMetrics registers the decision metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "capsnap",
			Name:      "decisions_total",
			Help:      "Check decisions by decision (allow, deny), reason, server_id, effect class and mode: enforce, or observe for a server whose decisions are made and not enforced (its denials pass).",
		}, []string{"decision", "reason", "server_id", "effect_class", "mode"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "capsnap",
			Name:      "check_duration_seconds",
			Help:      "Time to decide one Check, from request to response.",
			Buckets:   []float64{5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 5e-3, 25e-3},
		}),
	}
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "capsnap",
		Name:      "policy_reloads_total",
		Help:      "Policy reloads by result: ok, unchanged, invalid, refused_loosening.",
	}, []string{"result"})
	// The digest is a label of an info metric with one series at a time,
	// so its cardinality stays one.
	m.policy = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "capsnap",
		Name:      "policy_info",
		Help:      "The policy in force, by digest; always 1.",
	}, []string{"digest"})
	m.minted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "capsnap",
		Name:      "snapshots_minted_total",
		Help:      "Snapshots minted at tools/list, by server_id.",
	}, []string{"server_id"})
	m.invalid = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "capsnap",
		Name:      "snapshot_invalidations_total",
		Help:      "Tools invalidated in every snapshot of a server by a catalog change (list_changed or resync), by server_id.",
	}, []string{"server_id"})
	lookups := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "capsnap",
		Name:      "snapshot_lookups_total",
		Help:      "Snapshot lookups at tools/call by result: hit or miss.",
	}, []string{"result"})
	m.hits, m.misses = lookups.WithLabelValues("hit"), lookups.WithLabelValues("miss")
	m.deliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "capsnap",
		Name:      "deliveries_total",
		Help:      "tools/list responses decided on the response path, by server_id and result: ok (a listing, rewritten and pinned), passed (the server's own answer, not a listing, passed as it was sent), or the reason the response was not delivered.",
	}, []string{"server_id", "result"})
	m.withheld = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "capsnap",
		Name:      "tools_withheld_total",
		Help:      "Tools a server sent in a tools/list response that the agent was not delivered, by server_id and reason.",
	}, []string{"server_id", "reason"})
	m.unbound = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "capsnap",
		Name:      "delivery_unbound_total",
		Help:      "tools/list requests this replica allowed on the response path whose response never came back through it (Envoy's ext_proc filter) to any replica within 5s, by server_id.",
	}, []string{"server_id"})
	m.limits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "capsnap",
		Name:      "limit_decisions_total",
		Help:      "Calls counted against a budget or rate limit, by kind (budget, rate_limit), the name the policy gives it, and result: reserved (the call fit and took its amount) or exhausted (it did not, and was denied).",
	}, []string{"kind", "name", "result"})
	reg.MustRegister(m.decisions, m.latency, m.reloads, m.policy, m.minted, m.invalid, lookups, m.deliveries, m.withheld, m.unbound, m.limits)
	return m
}

func (m *Metrics) mintedFor(serverID string) {
	if m != nil {
		m.minted.WithLabelValues(serverID).Inc()
	}
}

func (m *Metrics) invalidated(serverID string, tools int) {
	if m != nil {
		m.invalid.WithLabelValues(serverID).Add(float64(tools))
	}
}

func (m *Metrics) lookedUp(hit bool) {
	switch {
	case m == nil:
	case hit:
		m.hits.Inc()
	default:
		m.misses.Inc()
	}
}

func (m *Metrics) reloaded(result string) {
	if m != nil {
		m.reloads.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) policyInForce(digest string) {
	if m != nil {
		m.policy.Reset()
		m.policy.WithLabelValues(digest).Set(1)
	}
}

func (s *Server) record(d *decision, elapsed time.Duration) {
	verdict, reason := "allow", "ok"
	if d.Denial != nil {
		verdict, reason = "deny", string(d.Denial.Reason)
	}
	if s.metrics != nil {
		server := s.serverLabel(d.ServerID)
		effect := "none"
		if d.Effect != 0 {
			effect = d.Effect.String()
		}
		mode := config.ModeEnforce
		if d.observed {
			mode = config.ModeObserve
		}
		s.metrics.decided(decisionLabels{verdict, reason, server, effect, mode})
		s.metrics.latency.Observe(elapsed.Seconds())
		// Names come from the policy, so the label values are bounded by
		// it; the principal, whose counter it is, is never a label.
		for _, r := range d.reserved {
			s.metrics.limits.WithLabelValues(r.Kind, r.Name, "reserved").Inc()
		}
		if d.Denial != nil && d.Denial.Limit != nil {
			kind := policy.KindBudget
			if d.Denial.Reason == deny.RateLimited {
				kind = policy.KindRateLimit
			}
			s.metrics.limits.WithLabelValues(kind, d.Denial.Limit.Name, "exhausted").Inc()
		}
	}
	s.audit(d, elapsed, nil)
}

// audit writes a decision's audit line; more, if set, adds to it.
func (s *Server) audit(d *decision, elapsed time.Duration, more func(*zerolog.Event) *zerolog.Event) {
	verdict, reason := "allow", "ok"
	if d.Denial != nil {
		verdict, reason = "deny", string(d.Denial.Reason)
	}
	ev := s.auditLog.Log().
		Str("decision", verdict).
		Str("reason", reason).
		Str("request_id", d.requestID).
		Str("principal", d.Principal).
		Str("server_id", d.ServerID).
		Str("mcp_method", d.Method).
		Str("protocol_version", string(d.version)).
		Int64("latency_us", elapsed.Microseconds())
	if d.phase != "" {
		ev = ev.Str("phase", d.phase)
	}
	if d.session != "" {
		ev = ev.Str("session", d.session)
	}
	if len(d.id) > 0 {
		ev = ev.RawJSON("jsonrpc_id", d.id)
	}
	if d.Tool != "" {
		ev = ev.Str("tool", d.Tool)
	}
	if d.call != nil && len(d.call.Arguments) > 0 {
		// A digest, never the arguments: audit lines are widely readable,
		// arguments may hold personal data, and the digest still proves
		// which arguments a decision saw.
		sum := sha256.Sum256(d.call.Arguments)
		var text [len("sha256:") + 2*sha256.Size]byte
		copy(text[:], "sha256:")
		hex.Encode(text[len("sha256:"):], sum[:])
		ev = ev.Bytes("arguments_digest", text[:])
	}
	if d.snapshot != nil {
		ev = ev.Str("epoch", d.snapshot.Epoch).Time("valid_until", d.snapshot.ValidUntil)
		if d.Tool == "" {
			ev = ev.Int("pinned_tools", len(d.snapshot.Pins)).Uint64("seq", d.snapshot.Seq)
		}
	}
	if d.SchemaDigest != "" {
		ev = ev.Str("snapshot_digest", d.SchemaDigest)
	}
	if d.liveDigest != "" {
		ev = ev.Str("live_digest", d.liveDigest)
	}
	if d.Effect != 0 {
		ev = ev.Str("effect_class", d.Effect.String()).Str("policy_digest", d.PolicyDigest)
	}
	// A call denied after it was sealed (a sequence rule, the store)
	// carries no envelope, and its line names none.
	if d.Denial == nil && d.envelopeID != "" {
		ev = ev.Str("envelope", d.envelopeID)
	}
	if d.Denial == nil && d.grantID != "" {
		ev = ev.Str("envelope_grant", d.grantID)
	}
	if d.staleRead {
		ev = ev.Bool("stale_catalog_read", true)
	}
	if len(d.reserved) > 0 {
		arr := zerolog.Arr()
		for _, r := range d.reserved {
			arr = arr.Dict(zerolog.Dict().Str("kind", r.Kind).Str("name", r.Name).Float64("amount", float64(r.Amount)/policy.Units))
		}
		ev = ev.Array("reserved", arr)
	}
	if d.Denial != nil && d.Denial.Limit != nil {
		l := d.Denial.Limit
		ev = ev.Dict("limit", zerolog.Dict().Str("name", l.Name).Float64("limit", l.Limit).Float64("used", l.Used).
			Float64("amount", l.Amount).Int64("window_s", l.WindowSeconds).Int64("retry_after_s", l.RetryAfterSeconds))
	}
	if d.Denial != nil && d.Denial.Reason.Drift() {
		ev = ev.Bool("capability_drift", true).Str("return_to", d.Denial.Reason.ReturnTo())
	}
	if d.Denial != nil {
		ev = ev.Str("detail", d.Denial.Detail)
	}
	// What would have been denied, and passed.
	if d.observed && d.Denial != nil {
		ev = ev.Bool("enforced", false)
	}
	if more != nil {
		ev = more(ev)
	}
	ev.Msg("decision")
}

// serverLabel is serverID as a metric label: a configured server's id, or
// "unknown" for any other a route names, so the label values stay bounded.
func (s *Server) serverLabel(serverID string) string {
	if !s.servers[serverID] {
		return "unknown"
	}
	return serverID
}

// recordDelivery audits and counts one decision on a tools/list response:
// what was delivered, and each tool withheld with why.
func (s *Server) recordDelivery(d *decision, out *Delivery, elapsed time.Duration) {
	server := s.serverLabel(d.ServerID)
	if s.metrics != nil {
		result := "ok"
		switch {
		case d.Denial != nil:
			result = string(d.Denial.Reason)
		case d.snapshot == nil:
			// The server's own answer (an error, an expired session's
			// 404), which delivers no tools.
			result = "passed"
		}
		s.metrics.deliveries.WithLabelValues(server, result).Inc()
		// Counted by reason, not one by one: a listing may withhold
		// hundreds, and a labelled counter's lookup costs more than its add.
		counts := map[deny.Reason]int{}
		for _, w := range out.Withheld {
			counts[w.Reason]++
		}
		for reason, n := range counts {
			s.metrics.withheld.WithLabelValues(server, string(reason)).Add(float64(n))
		}
	}
	s.audit(d, elapsed, func(ev *zerolog.Event) *zerolog.Event {
		if len(out.Withheld) == 0 {
			return ev
		}
		// What would have been withheld, and was delivered.
		if d.observed && d.Denial == nil {
			ev = ev.Bool("enforced", false)
		}
		arr := zerolog.Arr()
		for _, w := range out.Withheld {
			arr = arr.Dict(zerolog.Dict().Str("tool", w.Tool).Str("reason", string(w.Reason)).Str("detail", w.Detail))
		}
		return ev.Array("withheld", arr)
	})
}
