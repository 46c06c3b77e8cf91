package decide

import (
	"context"
	"testing"
	"time"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/deny"
)

// The decision's clock reaches a schedule through the call it checks: a
// refund at 10:00 on a Friday in Tallinn passes, the same refund at 17:00
// is denied outside_schedule with when the next window opens, as
// data.retry_at and, as an HTTP error, a 429 with Retry-After.
func TestScheduleFollowsTheClock(t *testing.T) {
	for _, tt := range []struct {
		form   string
		status int
	}{{config.StatusOK, 200}, {config.StatusHTTPError, 429}} {
		t.Run(tt.form, func(t *testing.T) {
			f := newFixture(t, func(o *Options) {
				o.Rules = mustRules(t, "testdata/schedule/policy.yaml")
				o.Denials.Status = tt.form
			})
			f.billing.push(t, "testdata/pack/catalog.json", nil)
			f.list(t, support, "billing", nil)
			// The fixture's clock starts at Fri 2027-01-15 10:00 in Tallinn.
			if o := f.call(t, refundOf(40)); o.reason != "" {
				t.Fatalf("Friday 10:00: %s (%s)", o.reason, o.data.Detail)
			}

			f.clock.advance(7 * time.Hour)
			f.billing.push(t, "testdata/pack/catalog.json", nil)
			f.list(t, support, "billing", nil)
			o := f.call(t, refundOf(40))
			const monday = "2027-01-18T09:00:00+02:00"
			if o.reason != deny.OutsideSchedule || o.data.RetryAt != monday || o.data.ReturnTo != deny.ReturnToLater {
				t.Fatalf("Friday 17:00: %s, data %+v; want outside_schedule, retry at %s", o.reason, o.data, monday)
			}
			resp, err := f.Check(context.Background(), refundOf(40).request())
			if err != nil {
				t.Fatal(err)
			}
			d := resp.GetDeniedResponse()
			if d == nil || int(d.GetStatus().GetCode()) != tt.status {
				t.Fatalf("status %v, want %d", d.GetStatus(), tt.status)
			}
			var after string
			for _, h := range d.GetHeaders() {
				if h.GetHeader().GetKey() == "retry-after" {
					after = h.GetHeader().GetValue()
				}
			}
			if want := map[int]string{200: "", 429: "Mon, 18 Jan 2027 07:00:00 GMT"}[tt.status]; after != want {
				t.Errorf("Retry-After %q, want %q", after, want)
			}
		})
	}
}
