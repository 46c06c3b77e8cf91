package decide

import (
	"strings"
	"testing"

	"github.com/capsnap/capsnap/deny"
)

// A caller that never lists is denied no_snapshot unless its server takes
// calls without listing; then each call is held to what is live and
// approved now and to the caller's grants and terms, audited
// without_snapshot, and only what needs a snapshot is refused.
func TestCallWithoutListing(t *testing.T) {
	t.Run("off by default", func(t *testing.T) {
		f, _ := changesFixture(t, "policy.yaml")
		if o := f.call(t, refundOf(40)); o.reason != deny.NoSnapshot {
			t.Fatalf("a call without listing: %q, want no_snapshot", o.reason)
		}
	})

	optIn := func(o *Options) { o.WithoutListing = []string{"billing"} }
	f, _ := changesFixture(t, "policy.yaml", optIn)
	other := refundOf(40)
	other.Principal = "spiffe://acme/agent/stranger"
	epoch := refundOf(40)
	epoch.Headers = map[string]string{"x-capsnap-epoch": "ep_not_one_of_ours"}
	for _, tc := range []struct {
		name   string
		call   checkCase
		want   deny.Reason
		detail string
	}{
		{"granted, within its terms", refundOf(40), "", ""},
		{"over a constraint", refundOf(400), deny.ConstraintViolation, "usd_cap_250"},
		{"not granted", other, deny.ToolNotGranted, ""},
		{"not served", argsCall("wipe_ledger", `{}`), deny.UnknownTool, "wipe_ledger"},
		{"invalid arguments", argsCall("refund", `{"order_id":"A-100"}`), deny.InvalidArguments, "amount"},
		// A caller that names a snapshot is held to it.
		{"naming a snapshot that is not there", epoch, deny.NoSnapshot, "ep_not_one_of_ours"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.audit.Reset()
			o := f.call(t, tc.call)
			if o.reason != tc.want || !strings.Contains(o.data.Detail, tc.detail) {
				t.Fatalf("%q (%s), want %q mentioning %q", o.reason, o.data.Detail, tc.want, tc.detail)
			}
			if tc.want == "" && !strings.Contains(f.audit.String(), `"without_snapshot":true`) {
				t.Errorf("an allowed call without listing is not audited as one:\n%s", f.audit)
			}
		})
	}

	// Change control holds: a changed definition waits for its reviewer
	// as it would for a caller that listed.
	f.redeploy(t, "testdata/changes/catalog-skip.json")
	if o := f.call(t, refundOf(40)); o.reason != deny.ToolUnderReview {
		t.Fatalf("a changed tool without listing: %q (%s), want tool_under_review", o.reason, o.data.Detail)
	}

	t.Run("a sequence rule needs a snapshot", func(t *testing.T) {
		f := packFixture(t, optIn)
		if o := f.call(t, argsCall("lookup_order", lookup)); o.reason != "" {
			t.Fatalf("lookup_order without listing: %q (%s)", o.reason, o.data.Detail)
		}
		o := f.call(t, argsCall("refund", `{"order_id":"A-100","amount":40,"reason_code":"damaged"}`))
		if o.reason != deny.NoSnapshot || !strings.Contains(o.data.Detail, "made without listing") {
			t.Fatalf("refund (after lookup_order) without listing: %q (%s), want no_snapshot", o.reason, o.data.Detail)
		}
		// Once it lists, the caller is held to its snapshot as ever.
		f.list(t, support, "billing", nil)
		f.audit.Reset()
		if o := f.call(t, argsCall("lookup_order", lookup)); o.reason != "" || strings.Contains(f.audit.String(), "without_snapshot") {
			t.Fatalf("after listing: %q, audit %s", o.reason, f.audit)
		}
	})
}
