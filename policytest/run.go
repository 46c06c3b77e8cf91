package policytest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// Result is one case decided.
type Result struct {
	Case Case
	// Got is the decision core's decision, and Denial its denial, nil for
	// an allowed call.
	Got    Outcome
	Denial *deny.Error
	// Explain is what policy explain says of the call, and Verdict how
	// it concludes.
	Explain []string
	Verdict policy.Verdict
	// Disagreement says how the core's decision contradicts explain's,
	// "" if it does not: a bug in capsnap, not in the policy.
	Disagreement string
	// Err is why the case could not be decided as written (its state
	// names a rule the call is not under), or what kept the harness from
	// deciding it.
	Err error
}

// Passed reports whether the case was decided as it expects, and as
// explain said it would be.
func (r Result) Passed() bool {
	return r.Err == nil && r.Disagreement == "" && r.Got == r.Case.Want
}

// Runner decides cases under one policy.
type Runner struct {
	Policy *policy.Policy
	// Tools are the tool definitions of a server's tools/list, by
	// server_id. A server without gets, for each case, a definition of
	// its tool that takes any arguments.
	Tools map[string][]json.RawMessage
	// Now is when a case without At is made; zero means time.Now.
	Now time.Time
}

// The harness's parts that a case does not set: the snapshot its tools/list
// mints, and who approves what a case says is approved.
const (
	epoch    = "ep_policy_test"
	approver = "capsnap-policy-test"
	// approvalsURL is where the approvals the harness asks for would be
	// decided: nowhere, the .invalid domain.
	approvalsURL = "https://approvals.policy-test.invalid"
)

// Run decides c, from a store, catalog and approvals of its own, and
// explains it.
func (r *Runner) Run(c Case) Result {
	at := c.At
	if at.IsZero() {
		at = r.Now
	}
	if at.IsZero() {
		at = time.Now()
	}
	res := Result{Case: c}
	var args map[string]any
	if err := json.Unmarshal(c.Arguments, &args); err != nil {
		res.Err = fmt.Errorf("arguments: %w", err)
		return res
	}
	res.Explain = r.Policy.Explain(c.Principal, c.Server, c.Tool, args, at)
	res.Verdict = r.Policy.Verdict(c.Principal, c.Server, c.Tool, args, at)
	res.Denial, res.Err = r.call(c, at)
	if res.Err != nil {
		return res
	}
	res.Got = outcomeOf(res.Denial)
	res.Disagreement = disagreement(res.Verdict, res.Denial)
	return res
}

// call makes the case's call through the decision core, as serve decides
// it: a tools/list mints the caller's snapshot, the state the case gives
// is put where the core reads it (the store's counters and call log, the
// approvals), and the tools/call is decided, all at the one instant at.
func (r *Runner) call(c Case, at time.Time) (*deny.Error, error) {
	clock := func() time.Time { return at }
	mem, err := store.NewMemory(store.MemoryOptions{MaxSnapshots: 16, Now: clock})
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	cat, stop, err := r.catalog(c, clock)
	if err != nil {
		return nil, err
	}
	defer stop()
	defaults := config.Default()
	approvals, err := approval.New(approval.Config{Store: mem.Approvals(), BaseURL: approvalsURL,
		PendingTTL: defaults.Approvals.PendingTTL, DeniedFor: defaults.Approvals.DeniedFor, Now: clock})
	if err != nil {
		return nil, err
	}
	defer approvals.Close()
	if err := approveDefinitions(r.Policy, mem, cat, c.Server, at); err != nil {
		return nil, err
	}
	// The principal is the peer certificate's, which request sets.
	srv, err := decide.New(decide.Options{
		Catalog: cat, Servers: []string{c.Server}, Rules: &decide.Rules{Policy: r.Policy},
		Denials: defaults.Denials, Snapshots: mem, SnapshotTTL: defaults.Snapshots.TTL, Bind: config.BindCatalog,
		Freshness: defaults.Catalog, Principal: config.Principal{Source: config.SourceMTLS}, Limits: mcpparse.DefaultLimits, Approvals: approvals,
		Audit: zerolog.Nop(), Now: clock, NewEpoch: func() string { return epoch },
	})
	if err != nil {
		return nil, err
	}
	listing := srv.Decide(request(c, `{"jsonrpc":"2.0","id":"list","method":"tools/list","params":{}}`))
	if listing.Denial != nil {
		return nil, fmt.Errorf("the tools/list that mints the call's snapshot was denied: %s: %s", listing.Denial.Reason, listing.Denial.Detail)
	}
	if err := r.prepare(c, mem, cat, approvals); err != nil {
		return nil, err
	}
	params, err := json.Marshal(map[string]any{"name": c.Tool, "arguments": c.Arguments})
	if err != nil {
		return nil, err
	}
	called := srv.Decide(request(c, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":`+string(params)+`}`))
	return called.Denial, nil
}

// request is body posted by the case's principal to its server, as
// Envoy hands it over.
func request(c Case, body string) *decide.Request {
	return &decide.Request{Method: "POST", ServerID: c.Server, Peer: c.Principal, Body: []byte(body),
		Headers: map[string]string{"content-type": "application/json", "accept": "application/json, text/event-stream"}}
}

// catalog is capsnap's view of the case's server, listed once at the
// clock's instant: the server's tools/list, or else one tool, the case's,
// that takes any arguments. stop ends it.
func (r *Runner) catalog(c Case, clock func() time.Time) (cat *catalog.Catalog, stop func(), err error) {
	defs, ok := r.Tools[c.Server]
	if !ok {
		def, err := json.Marshal(map[string]any{"name": c.Tool, "inputSchema": map[string]any{"type": "object"}})
		if err != nil {
			return nil, nil, err
		}
		defs = []json.RawMessage{def}
	}
	src := &listed{defs: defs, published: make(chan struct{})}
	cat = catalog.New(map[string]catalog.Source{c.Server: src}, catalog.Options{Clock: clock})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = cat.Run(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	<-src.published
	if _, _, err := cat.Lookup(c.Server); err != nil {
		stop()
		return nil, nil, fmt.Errorf("catalog of %s: %w", c.Server, err)
	}
	return cat, stop, nil
}

// listed is a catalog.Source that lists defs once.
type listed struct {
	defs      []json.RawMessage
	published chan struct{}
}

func (l *listed) Run(ctx context.Context, publish catalog.Publish) error {
	publish(l.defs, nil)
	close(l.published)
	<-ctx.Done()
	return nil
}

// approveDefinitions approves, for change control, the definitions the
// catalog lists of its server's tools under it: a case tests the policy's
// rules of a call, not a change to a tool, so what it lists is what
// reviewers approved.
func approveDefinitions(p *policy.Policy, mem *store.Memory, cat *catalog.Catalog, server string, at time.Time) error {
	list, _, err := cat.Lookup(server)
	if err != nil {
		return err
	}
	for name, t := range list.Tools {
		if p.ChangeControl(server, name) == nil {
			continue
		}
		d := store.Definition{Digest: t.Digest, Definition: t.Definition, By: approver, At: at}
		if _, err := mem.ApproveDefinition(server, name, "", d); err != nil {
			return err
		}
	}
	return nil
}

// prepare puts the case's state where the core reads it: the tools called
// before it in its snapshot's call log, what its budgets and rate limits
// hold in their counters, and a person's approval of it among the
// approvals.
func (r *Runner) prepare(c Case, mem *store.Memory, cat *catalog.Catalog, approvals *approval.Service) error {
	if len(c.Called) > 0 {
		snap, ok, err := mem.ByEpoch(epoch)
		if err != nil || !ok {
			return fmt.Errorf("called: the call's snapshot is not in the store (%v)", err)
		}
		for _, tool := range c.Called {
			if _, err := snap.Follows(tool, nil, true); err != nil {
				return fmt.Errorf("called: %w", err)
			}
		}
	}
	if len(c.Used) == 0 && c.Approval == "" {
		return nil
	}
	d, err := r.Policy.Decide(c.Principal, c.Server, c.Tool)
	if err != nil {
		return fmt.Errorf("the case sets what the call's rules hold, and the policy does not grant the call: %w", err)
	}
	call := policy.Call{Input: policy.Input{Principal: c.Principal, Server: c.Server, Tool: c.Tool}}
	for _, name := range slices.Sorted(maps.Keys(c.Used)) {
		t, err := countedBy(d, name)
		if err != nil {
			return fmt.Errorf("used: %w", err)
		}
		ch, ok := t.Taken(call, c.Used[name])
		if !ok {
			return fmt.Errorf("used: %s: %v is more than any counter holds, or not a whole number of calls", name, c.Used[name])
		}
		if u, err := mem.Reserve(ch); err != nil || !u.Allowed {
			return fmt.Errorf("used: %s: the store did not take %v (%v)", name, c.Used[name], err)
		}
	}
	if c.Approval != "" {
		return approve(c, d, cat, approvals)
	}
	return nil
}

// countedBy is the budget or rate limit of d named name, by its name or
// its field.
func countedBy(d policy.Decision, name string) (policy.Counted, error) {
	var found []policy.Counted
	var all []string
	for _, t := range d.Terms {
		ct, ok := t.(policy.Counted)
		if !ok {
			continue
		}
		n, field := ct.Names()
		all = append(all, fmt.Sprintf("%s (%s)", n, field))
		if n == name || field == name {
			found = append(found, ct)
		}
	}
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) > 1:
		return nil, fmt.Errorf("%s names more than one of the call's budgets and rate limits: %s; name it by its field", name, strings.Join(all, ", "))
	case len(all) == 0:
		return nil, fmt.Errorf("%s: the call is under no budget or rate limit", name)
	}
	return nil, fmt.Errorf("%s is none of the call's budgets and rate limits: %s", name, strings.Join(all, ", "))
}

// approve opens the request for a person's approval of exactly the
// case's call, bound as the core will bind it, and decides it as the case
// says.
func approve(c Case, d policy.Decision, cat *catalog.Catalog, approvals *approval.Service) error {
	if !slices.ContainsFunc(d.Terms, func(t policy.Term) bool { _, ok := t.(*policy.ApprovalRule); return ok }) {
		return fmt.Errorf("approval: %s/%s has no approval rule", c.Server, c.Tool)
	}
	list, _, err := cat.Lookup(c.Server)
	if err != nil {
		return err
	}
	tool, ok := list.Tools[c.Tool]
	if !ok {
		return fmt.Errorf("approval: %s's tools/list has no %s to approve a call of", c.Server, c.Tool)
	}
	args, err := approval.ArgsDigest(c.Arguments)
	if err != nil {
		return fmt.Errorf("approval: %w", err)
	}
	req, err := approvals.Open(approval.Request{
		Binding: approval.Binding{Principal: c.Principal, Server: c.Server, Tool: c.Tool,
			SchemaDigest: tool.Digest, PolicyDigest: d.Digest, ArgsDigest: args},
		Arguments: c.Arguments, EffectClass: d.Effect.String(), Rule: "capsnap policy test",
		Approvers: []string{approver}, ApprovalTTL: policy.DefaultApprovalTTL,
	})
	if err != nil || c.Approval == Pending {
		return err
	}
	_, err = approvals.Decide(req.ID, approval.Approver{ID: approver}, c.Approval == Approved, "")
	return err
}
