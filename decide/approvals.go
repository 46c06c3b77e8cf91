package decide

import (
	"errors"
	"fmt"
	"time"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// approvals is the approval service as a policy rule reads it: a person's
// approval of exactly one call, bound by the approval package's Binding.
type approvals struct{ svc *approval.Service }

func (a approvals) binding(x policy.Approval) (approval.Binding, error) {
	args := x.Arguments
	if len(args) == 0 {
		// A call without arguments is a call with none: {} to its server.
		args = []byte("{}")
	}
	d, err := approval.ArgsDigest(args)
	if err != nil {
		return approval.Binding{}, deny.Errorf(deny.InvalidArguments, "approval: the arguments cannot be canonicalized: %v", err)
	}
	return approval.Binding{Principal: x.Principal, Server: x.Server, Tool: x.Tool,
		SchemaDigest: x.SchemaDigest, PolicyDigest: x.PolicyDigest, ArgsDigest: d}, nil
}

// Consume implements policy.Approvals.
func (a approvals) Consume(x policy.Approval) (bool, error) {
	b, err := a.binding(x)
	if err != nil {
		return false, err
	}
	_, ok, err := a.svc.Consume(b)
	if err != nil {
		return false, fmt.Errorf("%w: approvals: %v", store.ErrUnavailable, err)
	}
	return ok, nil
}

// Ask implements policy.Approvals.
func (a approvals) Ask(x policy.Approval) (*deny.ApprovalInfo, error) {
	b, err := a.binding(x)
	if err != nil {
		return nil, err
	}
	r, err := a.svc.Open(approval.Request{Binding: b, Arguments: x.Arguments, EffectClass: x.Effect.String(),
		Rule: x.Rule, Approvers: x.Approvers, SelfApprove: x.SelfApprove, ApprovalTTL: x.TTL})
	var limited *approval.LimitError
	switch {
	case errors.As(err, &limited):
		return nil, &deny.Error{Reason: deny.RateLimited,
			Detail: fmt.Sprintf("%s opened %d approval requests in %s, the most it may: retry in %ds", x.Principal, limited.Used, limited.Window, retrySeconds(limited.RetryAfter)),
			Limit: &deny.LimitInfo{Name: "approval_requests", Limit: float64(limited.Max), Used: float64(limited.Used), Amount: 1,
				WindowSeconds: int64(limited.Window / time.Second), RetryAfterSeconds: retrySeconds(limited.RetryAfter)}}
	case err != nil:
		return nil, fmt.Errorf("%w: approvals: %v", store.ErrUnavailable, err)
	}
	info := &deny.ApprovalInfo{ID: r.ID, URL: a.svc.URL(r.ID), ExpiresAt: r.Expires,
		Message: fmt.Sprintf("%s asks to call %s/%s (%s): approve or deny this exact call", x.Principal, x.Server, x.Tool, x.Effect)}
	if r.State == approval.Denied {
		// The identical call, while the denial stands: "no", and why.
		why := ""
		if r.Reason != "" {
			why = ": " + r.Reason
		}
		return nil, &deny.Error{Reason: deny.ApprovalDenied, Approval: info,
			Detail: fmt.Sprintf("%s denied %s/%s with these exact arguments at %s%s; the same call is denied until %s",
				r.DecidedBy, x.Server, x.Tool, r.DecidedAt.UTC().Format(time.RFC3339), why, r.DecidedAt.Add(r.DeniedFor).UTC().Format(time.RFC3339))}
	}
	return info, nil
}

// retrySeconds is d in whole seconds, rounded up: a caller that waits
// this long finds the window moved.
func retrySeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// observedApprovals stand in for the approvals on a server in observe
// mode: a call the rule holds is decided approval_required, audited and
// counted, and no request is opened, nobody paged, no approval used.
type observedApprovals struct{}

var _ policy.Approvals = observedApprovals{}

// Consume implements policy.Approvals: no approval is used.
func (observedApprovals) Consume(policy.Approval) (bool, error) { return false, nil }

// Ask implements policy.Approvals: the denial a held call would get,
// with no request behind it.
func (observedApprovals) Ask(x policy.Approval) (*deny.ApprovalInfo, error) {
	return nil, deny.Errorf(deny.ApprovalRequired, "%s/%s with these exact arguments would need a person's approval (%s); in observe mode none is asked", x.Server, x.Tool, x.Rule)
}
