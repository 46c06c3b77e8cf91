package policy

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/deny"
)

// tallinn is a wall-clock time in Europe/Tallinn: UTC+2 in winter, +3 in
// summer.
func tallinn(t *testing.T, s string) time.Time {
	t.Helper()
	loc, err := time.LoadLocation("Europe/Tallinn")
	if err != nil {
		t.Fatal(err)
	}
	at, err := time.ParseInLocation("2006-01-02 15:04", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// A refund may be made Mon–Fri 09:00–17:00 in Tallinn, and only inside
// the grant's 06:00–22:00 UTC: the clock reaches the term through the
// call, and a denial says when the next window opens.
func TestScheduleCheck(t *testing.T) {
	p := mustLoad(t, "testdata/schedule.yaml")
	tests := []struct {
		name, tool, at string
		// retryAt is "" for an allowed call, else when the denial says
		// the next window opens (Tallinn wall clock).
		retryAt string
	}{
		{"Monday morning", "refund", "2026-12-07 09:00", ""},
		{"just before", "refund", "2026-12-07 08:59", "2026-12-07 09:00"},
		{"last minute", "refund", "2026-12-07 16:59", ""},
		{"at the end", "refund", "2026-12-07 17:00", "2026-12-08 09:00"},
		{"Friday evening", "refund", "2026-12-11 18:30", "2026-12-14 09:00"},
		{"Sunday", "refund", "2026-12-13 12:00", "2026-12-14 09:00"},
		// Summer time: 09:30 EEST is 06:30 UTC, inside both.
		{"summer", "refund", "2026-07-06 09:30", ""},
		// Winter: 08:30 UTC would be 10:30 in Tallinn; 07:30 Tallinn is
		// 05:30 UTC, outside the grant's too.
		{"winter, before both", "refund", "2026-12-07 07:30", "2026-12-07 09:00"},
		// The grant's own window: lookups in Tallinn's early hours are
		// before 06:00 UTC.
		{"grant, too early", "lookup_order", "2026-12-07 07:59", "2026-12-07 08:00"},
		{"grant, inside", "lookup_order", "2026-12-13 08:00", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decide(t, p, support, "billing", tt.tool)
			call := Call{Input: Input{Args: map[string]any{"amount": 40.0}, Principal: support, Server: "billing", Tool: tt.tool}, Now: tallinn(t, tt.at)}
			var err error
			for _, term := range d.Terms {
				if _, isSchedule := term.(*schedule); isSchedule {
					if err = term.Check(call); err != nil {
						break
					}
				}
			}
			if tt.retryAt == "" {
				if err != nil {
					t.Fatalf("denied: %v", err)
				}
				return
			}
			de, ok := deny.As(err)
			if !ok || de.Reason != deny.OutsideSchedule {
				t.Fatalf("got %v, want outside_schedule", err)
			}
			if want := tallinn(t, tt.retryAt); !de.RetryAt.Equal(want) {
				t.Errorf("retry at %s, want %s", de.RetryAt, want)
			}
			if !strings.Contains(de.Detail, "retry at "+de.RetryAt.Format(time.RFC3339)) {
				t.Errorf("detail %q does not say when", de.Detail)
			}
		})
	}
}

// A call with no time is outside every window; Precheck, which stands for
// a call whose time is not known, does not decide it.
func TestScheduleWithoutTime(t *testing.T) {
	d := decide(t, mustLoad(t, "testdata/schedule.yaml"), support, "billing", "refund")
	call := Call{Input: Input{Args: map[string]any{"amount": 40.0}, Principal: support, Server: "billing", Tool: "refund"}}
	i := slices.IndexFunc(d.Terms, func(t Term) bool { _, ok := t.(*schedule); return ok })
	if de, ok := deny.As(d.Terms[i].Check(call)); !ok || de.Reason != deny.OutsideSchedule || !de.RetryAt.IsZero() {
		t.Errorf("no time: %v", de)
	}
	if err := d.Precheck(call); err != nil {
		t.Errorf("Precheck without a time: %v", err)
	}
	call.Now = tallinn(t, "2026-12-12 10:00")
	if de, ok := deny.As(d.Precheck(call)); !ok || de.Reason != deny.OutsideSchedule {
		t.Errorf("Precheck on a Saturday: %v", de)
	}
}

// A schedule only reads the time: it runs after the constraints and
// before the rate limits, so a call it denies takes nothing.
func TestScheduleTermOrder(t *testing.T) {
	d := decide(t, mustLoad(t, "testdata/schedule.yaml"), support, "billing", "refund")
	var kinds []string
	for _, term := range d.Terms {
		switch term.(type) {
		case *Constraint:
			kinds = append(kinds, "constraint")
		case *schedule:
			kinds = append(kinds, "schedule")
		case *RateLimit:
			kinds = append(kinds, "rate_limit")
		}
	}
	if want := []string{"constraint", "schedule", "schedule", "rate_limit"}; !slices.Equal(kinds, want) {
		t.Errorf("terms %v, want %v", kinds, want)
	}
}

// A schedule is part of the decision digest, spelt as counted: a range of
// days and the days listed are one schedule. A policy without one keeps
// the digests it had (digests.golden).
func TestScheduleDigest(t *testing.T) {
	const base = `
tools:
  - server: billing
    tool: refund
    effect: money_move
%s
  - {server: billing, tool: lookup_order, effect: read}
principals:
  - id: a
    grants: [{server: billing, tools: ["*"]}]
`
	digest := func(schedule, tool string) string {
		t.Helper()
		return decide(t, mustParse(t, strings.Replace(base, "%s", schedule, 1)), "a", "billing", tool).Digest
	}
	none := digest("", "refund")
	ranged := digest(`    schedule: {zone: Europe/Tallinn, windows: [{days: [mon-fri], from: "09:00", to: "17:00"}]}`, "refund")
	listed := digest(`    schedule: {zone: Europe/Tallinn, windows: [{days: [fri, thu, wed, tue, mon], from: "09:00", to: "17:00"}]}`, "refund")
	shorter := digest(`    schedule: {zone: Europe/Tallinn, windows: [{days: [mon-fri], from: "09:00", to: "16:00"}]}`, "refund")
	if ranged == none || ranged != listed || shorter == ranged {
		t.Errorf("digests: none %s, mon-fri %s, listed %s, shorter %s", none, ranged, listed, shorter)
	}
	if digest(`    schedule: {zone: UTC, windows: [{from: "09:00", to: "17:00"}]}`, "lookup_order") != digest("", "lookup_order") {
		t.Error("refund's schedule changed lookup_order's digest")
	}
}

// A shorter window tightens; a longer one, another zone, or none at all
// loosens.
func TestScheduleLoosenings(t *testing.T) {
	const base = `
tools:
  - server: billing
    tool: refund
    effect: money_move
    schedule: {zone: %s, windows: [%s]}
principals:
  - id: a
    grants: [{server: billing, tools: [refund]}]
`
	load := func(zone, windows string) *Policy {
		t.Helper()
		src := strings.Replace(strings.Replace(base, "%s", zone, 1), "%s", windows, 1)
		if windows == "" {
			src = strings.Replace(src, "    schedule: {zone: "+zone+", windows: []}\n", "", 1)
		}
		return mustParse(t, src)
	}
	weekdays := load("Europe/Tallinn", `{days: [mon-fri], from: "09:00", to: "17:00"}`)
	tests := []struct {
		name string
		next *Policy
		want []string
	}{
		{"shorter", load("Europe/Tallinn", `{days: [mon-fri], from: "10:00", to: "17:00"}`), nil},
		{"fewer days", load("Europe/Tallinn", `{days: [mon-thu], from: "09:00", to: "17:00"}`), nil},
		{"longer", load("Europe/Tallinn", `{days: [mon-fri], from: "09:00", to: "18:00"}`), []string{
			`principal "a": billing/refund: schedule now also allows mon 17:00-18:00, tue 17:00-18:00, wed 17:00-18:00, thu 17:00-18:00, fri 17:00-18:00 Europe/Tallinn (was mon,tue,wed,thu,fri 09:00-17:00 Europe/Tallinn)`,
		}},
		{"a Saturday window", load("Europe/Tallinn", `{days: [mon-fri], from: "09:00", to: "17:00"}, {days: [sat], from: "10:00", to: "12:00"}`), []string{
			`principal "a": billing/refund: schedule now also allows sat 10:00-12:00 Europe/Tallinn (was mon,tue,wed,thu,fri 09:00-17:00 Europe/Tallinn)`,
		}},
		{"another zone", load("UTC", `{days: [mon-fri], from: "09:00", to: "17:00"}`), []string{
			`principal "a": billing/refund: schedule zone changed from Europe/Tallinn to UTC`,
		}},
		{"removed", load("UTC", ""), []string{
			`principal "a": billing/refund: schedule (mon,tue,wed,thu,fri 09:00-17:00 Europe/Tallinn) removed`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Loosenings(weekdays, tt.next); !slices.Equal(got, tt.want) {
				t.Errorf("Loosenings =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

// Explain says, at a given time, whether the call is inside each schedule
// and when the next window opens.
func TestExplainSchedule(t *testing.T) {
	p := mustLoad(t, "testdata/schedule.yaml")
	args := map[string]any{"amount": 40.0}
	inOrder(t, p.Explain(support, "billing", "refund", args, tallinn(t, "2026-12-07 10:00")), []string{
		"schedule (tools[0].schedule): mon,tue,wed,thu,fri 09:00-17:00 Europe/Tallinn: inside at Mon 2026-12-07 10:00 EET",
		"schedule (principals[0].grants[0].schedule): mon,tue,wed,thu,fri,sat,sun 06:00-22:00 UTC: inside at Mon 2026-12-07 08:00 UTC",
		"allowed, if its rate limits have room",
	})
	inOrder(t, p.Explain(support, "billing", "refund", args, tallinn(t, "2026-12-12 10:00")), []string{
		"schedule (tools[0].schedule): mon,tue,wed,thu,fri 09:00-17:00 Europe/Tallinn: OUTSIDE at Sat 2026-12-12 10:00 EET; the next window opens 2026-12-14T09:00:00+02:00",
		"denied (outside_schedule): tools[0].schedule",
	})
	inOrder(t, p.Explain(support, "billing", "refund", args, time.Time{}), []string{
		"schedule (tools[0].schedule): mon,tue,wed,thu,fri 09:00-17:00 Europe/Tallinn: not evaluated, no time given",
		"allowed, if it is made inside its schedule and its rate limits have room",
	})
	inOrder(t, mustLoad(t, "testdata/seed.yaml").Explain(support, "billing", "lookup_order", nil, time.Now()), []string{"no schedule"})
}

func TestMinuteOfDay(t *testing.T) {
	for s, want := range map[string]int{"00:00": 0, "09:30": 570, "23:59": 1439, "24:00": 1440} {
		if got, err := minuteOfDay(s); err != nil || got != want {
			t.Errorf("minuteOfDay(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "9:00", "+1:00", "09:3a", "09-30", "24:01", "25:00", "09:60", "0900", " 9:00", "09:00 "} {
		if got, err := minuteOfDay(s); err == nil {
			t.Errorf("minuteOfDay(%q) = %d, want an error", s, got)
		}
	}
}
