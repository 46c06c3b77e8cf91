package decide

import (
	"fmt"

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
	if err != nil {
		return nil, fmt.Errorf("%w: approvals: %v", store.ErrUnavailable, err)
	}
	return &deny.ApprovalInfo{ID: r.ID, URL: a.svc.URL(r.ID), ExpiresAt: r.Expires,
		Message: fmt.Sprintf("%s asks to call %s/%s (%s): approve or deny this exact call", x.Principal, x.Server, x.Tool, x.Effect)}, nil
}
