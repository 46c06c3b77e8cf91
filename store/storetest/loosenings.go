// The loosenings' part of the contract: an acceptance of a looser policy,
// recorded on one replica, is what every replica reads for exactly the
// files it accepts, until it lapses.

package storetest

import (
	"testing"
	"time"

	"github.com/capsnap/capsnap/store"
)

// runLoosenings runs the loosenings' part against the backends open makes.
func runLoosenings(t *testing.T, open Open) {
	tests := []struct {
		name string
		fn   func(*testing.T, Store, *Clock)
	}{
		{"AnAcceptanceIsReadBackWhole", anAcceptanceIsReadBackWhole},
		{"AnAcceptanceIsOfItsSourceOnly", anAcceptanceIsOfItsSourceOnly},
		{"AnAcceptanceLapses", anAcceptanceLapses},
		{"ALaterAcceptanceReplacesOne", aLaterAcceptanceReplacesOne},
		{"AnIncompleteAcceptanceIsRefused", anIncompleteAcceptanceIsRefused},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewClock(Start)
			tc.fn(t, open(t, clock), clock)
		})
	}
}

// Acceptance returns an acceptance of source by alice, made at at, for
// keep.
func Acceptance(source string, at time.Time, keep time.Duration) store.Acceptance {
	return store.Acceptance{
		Source: source, PolicyDigest: "sha256:pp", By: "alice@acme.example", Reason: "INC-42: the cap goes to 500",
		At: at.UTC(), Until: at.Add(keep).UTC(),
	}
}

func accept(t *testing.T, s Store, a store.Acceptance) {
	t.Helper()
	if err := s.AcceptLoosening(a); err != nil {
		t.Fatalf("AcceptLoosening: %v", err)
	}
}

// accepted fails the test unless the acceptance of source is want (nil:
// none).
func accepted(t *testing.T, s Store, source string, want *store.Acceptance) {
	t.Helper()
	got, ok, err := s.AcceptedLoosening(source)
	switch {
	case err != nil:
		t.Fatalf("AcceptedLoosening(%s): %v", source, err)
	case want == nil && ok:
		t.Fatalf("AcceptedLoosening(%s) = %+v, want none", source, got)
	case want == nil:
	case !ok:
		t.Fatalf("AcceptedLoosening(%s): none, want %+v", source, *want)
	case got.Source != want.Source || got.PolicyDigest != want.PolicyDigest || got.By != want.By || got.Reason != want.Reason ||
		!got.At.Equal(want.At) || !got.Until.Equal(want.Until):
		t.Fatalf("AcceptedLoosening(%s) = %+v, want %+v", source, got, *want)
	}
}

func anAcceptanceIsReadBackWhole(t *testing.T, s Store, clock *Clock) {
	a := Acceptance("sha256:0a", clock.Now(), time.Hour)
	accept(t, s, a)
	accepted(t, s, a.Source, &a)
}

func anAcceptanceIsOfItsSourceOnly(t *testing.T, s Store, clock *Clock) {
	a := Acceptance("sha256:0a", clock.Now(), time.Hour)
	accept(t, s, a)
	for _, other := range []string{"sha256:0b", "sha256:0a0", "sha256:0", ""} {
		accepted(t, s, other, nil)
	}
}

func anAcceptanceLapses(t *testing.T, s Store, clock *Clock) {
	a := Acceptance("sha256:0a", clock.Now(), time.Hour)
	accept(t, s, a)
	clock.Advance(time.Hour - time.Millisecond)
	accepted(t, s, a.Source, &a)
	clock.Advance(time.Millisecond)
	accepted(t, s, a.Source, nil)
	if err := s.AcceptLoosening(a); err == nil {
		t.Fatal("an acceptance that lapsed was recorded")
	}
	accepted(t, s, a.Source, nil)
}

func aLaterAcceptanceReplacesOne(t *testing.T, s Store, clock *Clock) {
	first := Acceptance("sha256:0a", clock.Now(), time.Hour)
	accept(t, s, first)
	clock.Advance(time.Minute)
	second := Acceptance("sha256:0a", clock.Now(), store.MaxAcceptance)
	second.By, second.Reason = "bob@acme.example", "INC-43: again"
	accept(t, s, second)
	accepted(t, s, first.Source, &second)
	clock.Advance(time.Hour)
	accepted(t, s, first.Source, &second)
}

func anIncompleteAcceptanceIsRefused(t *testing.T, s Store, clock *Clock) {
	for name, edit := range map[string]func(*store.Acceptance){
		"no source":         func(a *store.Acceptance) { a.Source = "" },
		"no one":            func(a *store.Acceptance) { a.By = "" },
		"no reason":         func(a *store.Acceptance) { a.Reason = "" },
		"until before at":   func(a *store.Acceptance) { a.Until = a.At },
		"kept for too long": func(a *store.Acceptance) { a.Until = a.At.Add(store.MaxAcceptance + time.Millisecond) },
	} {
		a := Acceptance("sha256:0a", clock.Now(), time.Hour)
		edit(&a)
		if err := s.AcceptLoosening(a); err == nil {
			t.Errorf("%s: recorded", name)
		}
		accepted(t, s, "sha256:0a", nil)
	}
}
