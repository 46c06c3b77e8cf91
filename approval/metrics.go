package approval

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	events   *prometheus.CounterVec
	pending  prometheus.Gauge
	webhooks *prometheus.CounterVec
	refused  *prometheus.CounterVec
	limited  prometheus.Counter
}

// newMetrics registers the approvals' metrics on reg, if there is one.
// Every label value is one of a fixed few: principals, tools and ids are
// never labels.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "capsnap", Subsystem: "approvals", Name: "total",
			Help: "Approval requests opened, approved, denied, consumed by the approved call, and expired undecided or unused, by event.",
		}, []string{"event"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "capsnap", Subsystem: "approvals", Name: "pending",
			Help: "Approval requests waiting for a person, in the store every replica shares, as of the last sweep.",
		}),
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "capsnap", Subsystem: "approvals", Name: "webhooks_total",
			Help: "Announcements of new approval requests to the webhook, by result: sent, failed (an error or a non-2xx answer), dropped (the queue was full).",
		}, []string{"result"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "capsnap", Subsystem: "approvals", Name: "refused_total",
			Help: "Requests to the approval page and API refused, by error code.",
		}, []string{"code"}),
		limited: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "capsnap", Subsystem: "approvals", Name: "limited_total",
			Help: "Held calls that opened no approval request because their principal had opened approvals.max_requests_per_principal in the window (denied rate_limited).",
		}),
	}
	for _, e := range []EventKind{EventRequested, EventApproved, EventDenied, EventConsumed, EventExpired} {
		m.event(e)
	}
	for _, r := range []string{"sent", "failed", "dropped"} {
		m.webhooks.WithLabelValues(r)
	}
	for _, e := range apiErrors {
		m.refused.WithLabelValues(e.code)
	}
	if reg != nil {
		reg.MustRegister(m.events, m.pending, m.webhooks, m.refused, m.limited)
	}
	return m
}

// event is event e's counter, labelled without the "approval_".
func (m *metrics) event(e EventKind) prometheus.Counter {
	return m.events.WithLabelValues(strings.TrimPrefix(string(e), "approval_"))
}
