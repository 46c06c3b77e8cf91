package policy

import (
	"slices"
	"strings"
	"testing"
	"time"
)

const changesBase = `
tools:
  - {server: billing, tool: refund, effect: money_move}
  - {server: billing, tool: lookup_order, effect: read}
  - {server: payments, tool: charge, effect: money_move}
principals:
  - id: a
    grants: [{server: billing, tools: ["*"]}]
`

// A tool's own rule wins over its server's; a server no rule names is not
// under change control.
func TestChangeControlLookup(t *testing.T) {
	p := mustParse(t, changesBase+`
changes:
  - {server: billing, reviewers: ["group:oncall"], accept: "change.kinds.all(k, k == 'title_changed')"}
  - {server: billing, tool: refund, first_sight: review, reviewers: [alice], ttl: 24h}
`)
	refund, lookup := p.ChangeControl("billing", "refund"), p.ChangeControl("billing", "lookup_order")
	if refund == nil || refund.Rule != "changes[1]" || !refund.Review || refund.TTL != 24*time.Hour || !slices.Equal(refund.Reviewers, []string{"alice"}) {
		t.Errorf("refund: %+v", refund)
	}
	if lookup == nil || lookup.Rule != "changes[0]" || lookup.Review || lookup.TTL != DefaultReviewTTL {
		t.Errorf("lookup_order: %+v", lookup)
	}
	if c := p.ChangeControl("payments", "charge"); c != nil {
		t.Errorf("payments is under %s", c.Rule)
	}
}

// Accept is evaluated over the kinds and fields of a change; no accept,
// or one that fails, accepts nothing.
func TestChangeControlAccepts(t *testing.T) {
	p := mustParse(t, changesBase+`
changes:
  - {server: billing, reviewers: [alice], accept: "change.kinds.all(k, k == 'title_changed')"}
  - {server: billing, tool: refund, reviewers: [alice], accept: "change.fields[3] == 'x'"}
  - {server: payments, reviewers: [alice]}
`)
	title := p.ChangeControl("billing", "lookup_order")
	tests := []struct {
		c      *ChangeControl
		kinds  []string
		accept bool
	}{
		{title, []string{"title_changed"}, true},
		{title, []string{"title_changed", "property_added"}, false},
		{title, []string{"description_changed"}, false},
		{p.ChangeControl("billing", "refund"), []string{"title_changed"}, false}, // index out of range: fails closed
		{p.ChangeControl("payments", "charge"), []string{"title_changed"}, false},
	}
	for i, tt := range tests {
		if got := tt.c.Accepts(tt.kinds, []string{"title"}); got != tt.accept {
			t.Errorf("%d: %s accepts %v: %v, want %v", i, tt.c.Rule, tt.kinds, got, tt.accept)
		}
	}
}

// Change control that admits more is a loosening a hot reload refuses;
// one that admits less is not.
func TestChangeControlLoosenings(t *testing.T) {
	old := mustParse(t, changesBase+`
changes:
  - {server: billing, first_sight: review, reviewers: [alice], accept: "change.kinds.all(k, k == 'title_changed')"}
`)
	tests := []struct {
		name, changes string
		want          []string
	}{
		{"the same", `
changes:
  - {server: billing, first_sight: review, reviewers: [alice], accept: "change.kinds.all(k, k == 'title_changed')"}
`, nil},
		{"tighter", `
changes:
  - {server: billing, first_sight: review, reviewers: [alice]}
  - {server: payments, reviewers: [bob]}
`, nil},
		{"removed", "", []string{"every tool of billing: no longer under change control (was changes[0])"}},
		{"looser", `
changes:
  - {server: billing, reviewers: [alice, mallory], accept: "true"}
`, []string{
			`every tool of billing: a tool first seen is now approved without review`,
			`every tool of billing: changes accepted without review when "true", was "change.kinds.all(k, k == 'title_changed')"`,
			`every tool of billing: changes may now be approved by mallory`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Loosenings(old, mustParse(t, changesBase+tt.changes))
			if !slices.Equal(got, tt.want) {
				t.Errorf("Loosenings =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

// Change rules are part of the policy's digest, not of any decision's: a
// snapshot pins the rules of calls, and change control governs what may
// be pinned.
func TestChangeRulesDigest(t *testing.T) {
	without := mustParse(t, changesBase)
	with := mustParse(t, changesBase+"changes: [{server: billing, reviewers: [alice]}]\n")
	if without.Digest() == with.Digest() {
		t.Error("change rules do not change the policy digest")
	}
	a, _ := without.Decide("a", "billing", "refund")
	b, _ := with.Decide("a", "billing", "refund")
	if a.Digest != b.Digest {
		t.Error("change rules changed a decision digest")
	}
}
