// The audit line of every decision, and what it adds to the metrics.

package decide

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/policy"
	"github.com/rs/zerolog"
)

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
	if d.withoutListing {
		ev = ev.Bool("without_snapshot", true)
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
	if d.Denial != nil && d.Denial.Change != nil {
		ev = ev.Dict("change", zerolog.Dict().Strs("kinds", d.Denial.Change.Kinds).Strs("fields", d.Denial.Change.Fields))
	}
	if d.Denial != nil && d.Denial.Review != nil {
		ev = ev.Str("review", d.Denial.Review.ID)
	}
	if d.Denial != nil {
		ev = ev.Str("detail", d.Denial.Detail)
		if d.Denial.Cause != "" {
			ev = ev.Str("cause", d.Denial.Cause)
		}
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
