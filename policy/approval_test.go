package policy

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/deny"
)

// fakeApprovals answers Consume with ok (or err) and records what it was
// asked.
type fakeApprovals struct {
	ok       bool
	err      error
	consumed []Approval
	asked    []Approval
}

func (f *fakeApprovals) Consume(a Approval) (bool, error) {
	f.consumed = append(f.consumed, a)
	return f.ok, f.err
}

func (f *fakeApprovals) Ask(a Approval) (*deny.ApprovalInfo, error) {
	f.asked = append(f.asked, a)
	return &deny.ApprovalInfo{ID: "ap1", URL: "https://approve.example/approvals/ap1", ExpiresAt: time.Unix(1_800_000_000, 0)}, f.err
}

func TestApprovalRule(t *testing.T) {
	p := mustParse(t, mustRead(t, "testdata/approval.yaml"))
	d, err := p.Decide("spiffe://acme/agent/support-refund", "billing", "refund")
	if err != nil || approvalOf(d) == nil || d.Terms[len(d.Terms)-1] != Term(approvalOf(d)) {
		t.Fatalf("decision %+v, %v: want the approval rule last among its terms", d, err)
	}
	call := func(amount float64, store Approvals) Call {
		args := json.RawMessage(`{"amount":` + json.Number(jsonNum(amount)).String() + `}`)
		return Call{Input: Input{Args: map[string]any{"amount": amount}, Principal: "agent", Server: "billing", Tool: "refund"},
			Arguments: args, SchemaDigest: "sha256:s", PolicyDigest: d.Digest, Effect: d.Effect, Approvals: store}
	}
	for _, tt := range []struct {
		name    string
		amount  float64
		store   *fakeApprovals
		want    deny.Reason
		err     bool
		consume int
		ask     int
	}{
		{"under the condition", 50, &fakeApprovals{}, "", false, 0, 0},
		{"approved", 150, &fakeApprovals{ok: true}, "", false, 1, 0},
		{"not approved", 150, &fakeApprovals{}, deny.ApprovalRequired, false, 1, 1},
		{"the store down", 150, &fakeApprovals{err: errors.New("down")}, "", true, 1, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := approvalOf(d).Check(call(tt.amount, tt.store))
			de, isDenial := deny.As(err)
			switch {
			case tt.want != "" && (!isDenial || de.Reason != tt.want || de.Approval == nil || de.Approval.URL == ""):
				t.Fatalf("Check = %v, want %s with where to approve", err, tt.want)
			case tt.want == "" && tt.err != (err != nil && !isDenial):
				t.Fatalf("Check = %v, want a store error: %v", err, tt.err)
			}
			if len(tt.store.consumed) != tt.consume || len(tt.store.asked) != tt.ask {
				t.Fatalf("consumed %d, asked %d; want %d, %d", len(tt.store.consumed), len(tt.store.asked), tt.consume, tt.ask)
			}
			for _, a := range tt.store.consumed {
				if a.Principal != "agent" || a.SchemaDigest != "sha256:s" || a.PolicyDigest != d.Digest || a.TTL != 10*time.Minute || len(a.Approvers) != 2 || string(a.Arguments) == "" {
					t.Errorf("asked for %+v", a)
				}
			}
		})
	}
	if err := approvalOf(d).Check(call(150, nil)); err == nil {
		t.Error("a call held for approval with no approvals store was not refused")
	}
}

func jsonNum(f float64) string { b, _ := json.Marshal(f); return string(b) }

// An approval rule's name is what people read, wherever the rule stands in
// the file; it is part of the digest only when set, so a rule without one
// keeps the digest it had.
func TestApprovalRuleName(t *testing.T) {
	unnamed := mustParse(t, mustRead(t, "testdata/approval.yaml"))
	named := mustParse(t, strings.Replace(mustRead(t, "testdata/approval.yaml"), "    approval:\n", "    approval:\n      name: refunds_over_100\n", 1))
	a := decide(t, unnamed, support, "billing", "refund")
	b := decide(t, named, support, "billing", "refund")
	if a.Digest == b.Digest {
		t.Error("a name left the digest as it was")
	}
	if got := approvalOf(b).describe(); !strings.HasPrefix(got, `"refunds_over_100" (tools[0].approval)`) {
		t.Errorf("described as %q", got)
	}
	if l := Loosenings(named, unnamed); len(l) != 0 {
		t.Errorf("a name removed is a loosening: %v", l)
	}
}
