package decide

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capsnap/capsnap/internal/bounded"
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
	// limits counts budgets' and rate limits' reservations and refusals;
	// resets, the resets of their counters an operator asked for.
	limits, resets *prometheus.CounterVec
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
		Help:      "Policy reloads by result: ok, unchanged, invalid, refused_loosening, unrecorded (a loosening accepted that the store could not record for every replica).",
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
	m.resets = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "capsnap",
		Name:      "limit_resets_total",
		Help:      "Counters of a budget or rate limit an operator reset (capsnap budgets reset), by kind (budget, rate_limit) and the name the policy gives it; each is audited with who and why.",
	}, []string{"kind", "name"})
	reg.MustRegister(m.decisions, m.latency, m.reloads, m.policy, m.minted, m.invalid, lookups, m.deliveries, m.withheld, m.unbound, m.limits, m.resets)
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

func (m *Metrics) counterReset(kind, name string) {
	if m != nil {
		m.resets.WithLabelValues(kind, name).Inc()
	}
}

func (m *Metrics) policyInForce(digest string) {
	if m != nil {
		m.policy.Reset()
		m.policy.WithLabelValues(digest).Set(1)
	}
}
