package deny

import (
	"slices"
	"testing"
)

// Every declared reason has its own row, and every row is a declared
// reason with a status and a next step a caller can act on.
func TestEveryReasonHasASpec(t *testing.T) {
	reasons := declared(t)
	for _, r := range reasons {
		s, ok := specs[r]
		if !ok {
			t.Errorf("%s has no row in specs", r)
			continue
		}
		if s.Status < 400 || s.Status > 599 {
			t.Errorf("%s: status %d is not an HTTP error", r, s.Status)
		}
		if r.NextStep() == "" {
			t.Errorf("%s: return_to %q has no next step", r, s.ReturnTo)
		}
	}
	for r := range specs {
		if !slices.Contains(reasons, r) {
			t.Errorf("specs has a row for %s, which deny.go does not declare", r)
		}
	}
}

// The five drift reasons are the seed's, each sending the caller where the
// seed says; a reason without a row is a plain, final 403.
func TestDrift(t *testing.T) {
	want := map[Reason]string{
		SchemaDrift: ReturnToPlanning, PolicyDrift: ReturnToAuthorization, PrincipalMismatch: ReturnToNone,
		EffectEscalation: ReturnToReview, SnapshotExpired: ReturnToPlanning,
	}
	for _, r := range declared(t) {
		returnTo, drift := want[r]
		if r.Drift() != drift {
			t.Errorf("%s: Drift %v, want %v", r, r.Drift(), drift)
		}
		if drift && r.ReturnTo() != returnTo {
			t.Errorf("%s: return_to %s, want %s", r, r.ReturnTo(), returnTo)
		}
	}
	if s := Reason("not_a_reason").Spec(); s.Status != 403 || s.ReturnTo != ReturnToNone || s.Drift {
		t.Errorf("a reason without a row: %+v", s)
	}
}

func TestRetryAfter(t *testing.T) {
	tests := []struct {
		limit *LimitInfo
		want  string
	}{
		{nil, ""},
		{&LimitInfo{Name: "daily", RetryAfterSeconds: 0}, ""},
		{&LimitInfo{Name: "daily", RetryAfterSeconds: 3600}, "3600"},
	}
	for _, tt := range tests {
		if got := tt.limit.RetryAfter(); got != tt.want {
			t.Errorf("%+v: RetryAfter() = %q, want %q", tt.limit, got, tt.want)
		}
	}
}
