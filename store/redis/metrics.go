package redis

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	up       prometheus.Gauge
	failures *prometheus.CounterVec
	rejected *prometheus.CounterVec
	resyncs  prometheus.Counter
	rewound  prometheus.Counter
}

// newMetrics registers the store's metrics on reg, if there is one. Every
// label value is one of a fixed few: an operation, a record kind.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "capsnap", Subsystem: "store", Name: "up",
			Help: "1 while the shared snapshot store answers within its timeout; 0 while every tools/list and tools/call is denied store_unavailable.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "capsnap", Subsystem: "store", Name: "failures_total",
			Help: "Snapshot store operations that failed or timed out, by operation; each makes the store unavailable until a probe succeeds.",
		}, []string{"op"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "capsnap", Subsystem: "store", Name: "records_rejected_total",
			Help: "Records in the snapshot store that failed their MAC, by kind: each is audited and treated as absent (an invalidation: as a change now).",
		}, []string{"kind"}),
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "capsnap", Subsystem: "store", Name: "resyncs_total",
			Help: "Times this replica re-read the shared invalidations because Redis said they moved, or a connection dropped.",
		}),
		rewound: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "capsnap", Subsystem: "store", Name: "sequence_rewound_total",
			Help: "Times this replica saw the invalidation sequence go back (Redis lost acknowledged writes, as in a failover, or an old record was written back) and started a new incarnation.",
		}),
	}
	for _, op := range []string{"probe", "resync", "put", "get", "follows", "invalidate", "redeem", "reserve", "release", "count", "reset", "loosening"} {
		m.failures.WithLabelValues(op)
	}
	for _, k := range []string{kindSeq, kindInvalidation, kindSnapshot, kindLatest, kindRedemption, kindLoosening} {
		m.rejected.WithLabelValues(k)
	}
	if reg != nil {
		reg.MustRegister(m.up, m.failures, m.rejected, m.resyncs, m.rewound)
	}
	return m
}
