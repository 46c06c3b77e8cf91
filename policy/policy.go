// Package policy is the operator's say over which principal may call which
// tool, how consequential each tool is, and on what terms.
//
// The effect class of a tool comes from here and only from here: never from
// the model, and never from the annotations a server publishes about itself.
// A tool the policy has not classified is denied as if it were the riskiest.
//
// # The file
//
//	lockfile: capsnap.lock          # optional approvals lockfile, relative to this file
//	tools:                          # the operator classifies every tool
//	  - server: billing
//	    tool: refund
//	    effect: money_move          # read < write < money_move < admin
//	    capabilities: [payments.refund]
//	    after: [lookup_order]       # must have been called (and allowed) first under the same snapshot
//	    constraints:                # CEL over args, principal, server, tool; all must hold
//	      - name: usd_cap_250
//	        expr: "args.amount <= 250"
//	        message: "refunds are capped at USD 250"
//	    budgets:                    # a sum over each principal's allowed calls in a window
//	      - {name: daily_refunds, amount: args.amount, limit: 500, window: 24h}
//	    rate_limits:                # a count of them
//	      - {name: refund_burst, limit: 10, window: 1m}
//	principals:
//	  - id: spiffe://acme/agent/support-refund     # exact; or id_prefix: spiffe://acme/agent/
//	    grants:
//	      - server: billing
//	        tools: [refund, lookup_order]         # or ["*"]: every classified tool of billing
//	        max_effect: money_move                # optional ceiling
//	        capabilities: [payments.refund]       # the tags this grant confers
//	        constraints: []                       # optional, in addition to the tools'
//	        budgets: []                           # optional, over every tool of the grant
//	        rate_limits: []                       # optional; per: tool (default) or principal
//
// Decoding is strict: an unknown key, a second YAML document, or any rule
// that could not take effect as written (a grant of an unclassified tool, an
// unknown or cyclic after, a constraint that does not compile to bool) is an
// error naming the field, because a policy that loads with a typo in it
// denies or allows something the operator did not mean.
//
// # Which rule applies
//
// A principal is decided by its exact id rule if there is one, else by the
// longest id_prefix rule that is a prefix of it, and by that one rule only:
// rules are never merged. Reading one rule then tells an operator everything
// the principals it matches may do, and adding a rule for a narrower set of
// principals replaces what a broader rule gave them instead of silently
// adding to it.
//
// Within that rule the same holds for grants: a (server, tool) is decided by
// the grant that names the tool, else by the grant of "*" on that server.
// Naming a tool in two grants of one rule, or "*" twice for one server, is
// an error, so that at most one grant can ever decide. The grant grants the
// tool if and only if the tool's effect class is at most the grant's
// max_effect (when it has one) and the tool's capability tags are a subset
// of the grant's capabilities: a call may exercise only what was granted, and
// a tool with no tags needs none. "*" stands for every tool the policy
// classifies on the server, now or later; a tool the server adds stays
// denied as unclassified until the operator classifies it.
//
// # Constraints
//
// A constraint is a CEL expression that must evaluate to true: the tool's
// constraints and then the deciding grant's all apply. The variables are
// args (map(string, dyn): the call's arguments as decoded from JSON, so every
// number is a double; comparisons across int and double work, as in
// args.amount <= 250, but arithmetic mixes no types, so write 250.0 there),
// principal, server and tool (strings). Each expression is compiled once,
// must type-check to bool, and is evaluated under a cost limit
// (MaxConstraintCost). An evaluation that fails for any reason (a missing
// argument, a wrong type, the cost limit) means the constraint does not hold:
// constraints fail closed.
//
// # Sequence rules
//
// A tool's after lists tools of the same server that must have been called,
// and allowed, earlier under the same snapshot. The policy validates them
// (classified, acyclic); keeping track of the calls is the caller's job.
//
// # Budgets and rate limits
//
// A budget sums a CEL amount, a rate limit counts calls, over each
// principal's allowed calls in a window, on a tool or on every tool of a
// grant. They are terms that record (Reserver): a call is allowed only if
// it fits, and takes its amount as it is allowed, from a counter in a
// Counters store the replicas share (counters.go says how a window is
// counted). An amount that cannot be evaluated, or is no number of at
// least 0, denies the call, as a constraint that fails does.
//
// # Rule kinds
//
// Every key of a tool rule or grant past its classification (constraints,
// rate_limits, budgets, after, approval) is a Kind, in a file of its own
// that registers it: it decodes and validates what is written, compiles it
// into the terms every call must satisfy, adds its part to the decision
// digest, says how a new policy's rules of it are looser, explains itself
// and names the arguments it reads. A key no kind has is an error naming
// the field. kind.go says how to add one.
//
// # Digests
//
// Each allowed decision carries the digest of exactly the rules behind it:
// the tool's rule and the deciding grant (see Decision.Digest), budgets and
// rate limits included. A snapshot
// pins it, so editing one tool's rule drift-denies only that tool's
// snapshots, and reordering rules in the file changes no decision digest.
//
// # Reloading
//
// Loosenings lists every way a new policy is looser than the one in force,
// so that a hot reload cannot silently raise a cap or widen a grant.
package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/deny"
)

// EffectClass is the platform-assigned consequence of calling a tool,
// ordered from least to most consequential.
type EffectClass int

const (
	Read EffectClass = iota + 1
	Write
	MoneyMove
	Admin
)

var effectNames = map[EffectClass]string{Read: "read", Write: "write", MoneyMove: "money_move", Admin: "admin"}

func (e EffectClass) String() string {
	if n, ok := effectNames[e]; ok {
		return n
	}
	return "unclassified"
}

// ParseEffectClass reads an effect class by its policy-file name.
func ParseEffectClass(s string) (EffectClass, error) {
	for c, n := range effectNames {
		if n == s {
			return c, nil
		}
	}
	return 0, fmt.Errorf("unknown effect class %q (want read, write, money_move or admin)", s)
}

// File is the policy file as the operator writes it.
type File struct {
	// Lockfile is the approvals lockfile the policy admits tools by, if
	// any; Load resolves it relative to the policy file.
	Lockfile string `yaml:"lockfile,omitempty" json:"lockfile,omitempty"`
	// Tools classifies each (server, tool) pair.
	Tools []ToolRule `yaml:"tools" json:"tools"`
	// Principals lists who may call what.
	Principals []PrincipalRule `yaml:"principals" json:"principals"`
	// Changes put servers' tools under change control (ChangeRule).
	Changes []ChangeRule `yaml:"changes,omitempty" json:"changes,omitempty"`
}

// ToolRule classifies one tool of one server and sets the terms of every
// call to it.
type ToolRule struct {
	Server string `yaml:"server" json:"server"`
	Tool   string `yaml:"tool" json:"tool"`
	Effect string `yaml:"effect" json:"effect"`
	// Capabilities are the tags the tool exercises; a grant must confer
	// all of them.
	Capabilities []string `yaml:"capabilities,omitempty" json:"capabilities,omitempty"`
	// Rules are the rules of each kind (constraints, budgets, after, ...),
	// by key, as written: each Kind decodes its own.
	Rules map[string]yaml.Node `yaml:",inline" json:"-"`
}

// PrincipalRule grants the principals it matches tools on servers. Exactly
// one of ID (a SPIFFE ID or JWT subject, matched exactly) and IDPrefix
// (matched as a prefix) is set.
type PrincipalRule struct {
	ID       string  `yaml:"id,omitempty" json:"id,omitempty"`
	IDPrefix string  `yaml:"id_prefix,omitempty" json:"id_prefix,omitempty"`
	Grants   []Grant `yaml:"grants" json:"grants"`
}

// Grant names tools of one server, or "*" for every tool the policy
// classifies on it now or later, and the terms it grants them under.
type Grant struct {
	Server string   `yaml:"server" json:"server"`
	Tools  []string `yaml:"tools" json:"tools"`
	// MaxEffect, when set, is the strongest effect class granted: a named
	// tool above it is not granted.
	MaxEffect string `yaml:"max_effect,omitempty" json:"max_effect,omitempty"`
	// Capabilities are the tags this grant confers.
	Capabilities []string `yaml:"capabilities,omitempty" json:"capabilities,omitempty"`
	// Rules are the rules of each kind a grant may carry (constraints,
	// budgets, ...), in addition to the tools' own, as written.
	Rules map[string]yaml.Node `yaml:",inline" json:"-"`
}

// Wildcard in a grant's tool list stands for every classified tool.
const Wildcard = "*"

type toolKey struct{ server, tool string }

func (k toolKey) String() string { return k.server + "/" + k.tool }

// Policy is a validated, immutable policy. Reloading makes a new one.
type Policy struct {
	tools map[toolKey]*tool
	// exact and prefixes hold the principal rules by id and id_prefix;
	// prefixLens are the distinct prefix lengths, longest first, so that
	// the longest matching prefix is found by map lookups alone.
	exact      map[string]*principalRule
	prefixes   map[string]*principalRule
	prefixLens []int
	lockfile   string
	digest     string
	// order is the tools in file order.
	order []toolKey
	// changes are the change rules, by server and tool ("" for every
	// tool of the server).
	changes map[changeKey]*ChangeControl
}

// tool is a compiled ToolRule.
type tool struct {
	key          toolKey
	field        string
	effect       EffectClass
	capabilities []string // sorted, distinct
	// rules are its rules of each kind, by the kind's index in kinds.
	rules []Rules
}

// principalRule is a compiled PrincipalRule with every decision it makes
// worked out in advance.
type principalRule struct {
	name   string // "id:<id>" or "id_prefix:<prefix>"
	field  string
	grants []*grant
	// outcomes holds what the rule says about every classified tool.
	outcomes map[toolKey]*outcome
	// allowed holds, per server, the sorted names of the tools it grants.
	allowed map[string][]string
}

// grant is a compiled Grant.
type grant struct {
	field        string
	server       string
	wildcard     bool
	names        []string // as written, when not a wildcard
	maxEffect    EffectClass
	capabilities []string // sorted, distinct
	// rules are its rules of each kind, by the kind's index in kinds; nil
	// for a kind a grant cannot carry.
	rules []Rules
}

// outcome is one rule's verdict on one classified tool.
type outcome struct {
	granted  bool
	decision Decision
	// grant is the grant that decided, nil when none names the tool.
	grant *grant
	// why says why the tool is not granted, and notGranted is the
	// denial's detail but for the principal that leads it: made once, as
	// a listing of a large catalog denies most of its tools.
	why, notGranted string
}

// Decision is what the policy says about an allowed (principal, server,
// tool). Its slices are shared with the policy and must not be modified.
type Decision struct {
	Effect EffectClass
	// Digest is the JCS SHA-256 of exactly the rules that produced this
	// decision: the tool's rule (server, tool, effect, capabilities and
	// its rules of every kind) and the deciding grant (principal rule,
	// server, the tool name or "*", max_effect, capabilities and its rules
	// of every kind). Editing one tool's rule leaves every other tool's
	// digest alone.
	Digest string
	// Rule is the principal rule that decided: "id:<id>" or
	// "id_prefix:<prefix>".
	Rule string
	// Capabilities are the tags the tool exercises; sorted.
	Capabilities []string
	// Terms are the rules of every kind compiled, that a call must
	// satisfy once its contract is the pinned one, in the kinds' order
	// (Kind.Stage): those that only read the call (constraints), then
	// those that record it (Term.Records): the rate limits and budgets,
	// which reserve (Reserver) and can give back, before the sequence
	// rule, and last the approval, which cannot.
	Terms []Term

	// applied are what each kind says, by the kind's index in kinds.
	applied []Applied
}

// Precheck decides call on the terms that need nothing but the call
// (Prechecker): what policy explain and check can say without the store.
func (d Decision) Precheck(call Call) error {
	for _, t := range d.Terms {
		if p, ok := t.(Prechecker); ok {
			if err := p.Precheck(call); err != nil {
				return err
			}
		}
	}
	return nil
}

// Load reads and validates a policy file. A relative lockfile path in it is
// resolved against the policy file's directory.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load policy: %w", err)
	}
	return ParseFile(path, data)
}

// ParseFile is Load of data, the bytes read from path: a lockfile it names
// by a relative path is relative to path's directory.
func ParseFile(path string, data []byte) (*Policy, error) {
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("load policy %s: %w", path, err)
	}
	if p.lockfile != "" && !filepath.IsAbs(p.lockfile) {
		p.lockfile = filepath.Join(filepath.Dir(path), p.lockfile)
	}
	return p, nil
}

// Parse decodes a policy strictly (unknown keys are errors, one document
// only) and validates it. A lockfile path stays as written.
func Parse(data []byte) (*Policy, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f File
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("policy is empty")
		}
		return nil, fmt.Errorf("decode policy: %w", err)
	}
	if err := dec.Decode(new(any)); !errors.Is(err, io.EOF) {
		return nil, errors.New("decode policy: more than one YAML document")
	}
	return Compile(f)
}

// Digest identifies the whole policy, for logs and the info metric.
func (p *Policy) Digest() string { return p.digest }

// SpanningRules describes, for people, the rules of server/tool's own
// tool rule that hold its calls beyond one call: its budgets, rate limits
// and approval. A grant's own are the principal rule's, and not listed.
func (p *Policy) SpanningRules(server, tool string) []string {
	t, ok := p.tools[toolKey{server, tool}]
	if !ok {
		return nil
	}
	var out []string
	for _, r := range t.rules {
		if s, ok := r.(spanning); ok {
			out = append(out, s.spans()...)
		}
	}
	return out
}

// spanning is Rules that hold calls beyond one call, and say how.
type spanning interface{ spans() []string }

// Lockfile is the approvals lockfile the policy names, "" for none.
func (p *Policy) Lockfile() string { return p.lockfile }

// Decide says whether principal may call tool on server, and on which
// terms. A denial is a *deny.Error: deny.UnclassifiedTool for a tool the
// policy does not classify (whoever asks), else deny.ToolNotGranted with the
// reason in its detail. It is on every call's path, so it only looks up what
// Compile worked out.
func (p *Policy) Decide(principal, server, tool string) (Decision, error) {
	d := Principal{p: p, principal: principal, rule: p.match(principal)}
	return d.Decide(server, tool)
}

// Principal decides for one principal, matched to its rule once: a
// listing decides every tool it delivers for the same principal, hundreds
// of them, and a denial's detail names the principal quoted, which is made
// once too. It keeps that quoted name, so one goroutine at a time uses it.
type Principal struct {
	p         *Policy
	principal string
	rule      *principalRule
	quoted    string
}

// For returns the decisions of principal.
func (p *Policy) For(principal string) *Principal {
	return &Principal{p: p, principal: principal, rule: p.match(principal)}
}

// Decide is Policy.Decide for d's principal.
func (d *Principal) Decide(server, tool string) (Decision, error) {
	k := toolKey{server, tool}
	if _, classified := d.p.tools[k]; !classified {
		return Decision{}, deny.Errorf(deny.UnclassifiedTool, "policy assigns %s/%s no effect class", server, tool)
	}
	if d.rule == nil {
		return Decision{}, deny.Errorf(deny.ToolNotGranted, "principal %q is not granted %s/%s: no principal rule matches it", d.principal, server, tool)
	}
	o := d.rule.outcomes[k]
	if !o.granted {
		if d.quoted == "" {
			d.quoted = strconv.Quote(d.principal)
		}
		return Decision{}, &deny.Error{Reason: deny.ToolNotGranted, Detail: "principal " + d.quoted + o.notGranted}
	}
	return o.decision, nil
}

// Allowed lists, sorted, the tools the principal may call on server, so a
// denial can tell the caller what it may do instead.
func (p *Policy) Allowed(principal, server string) []string {
	r := p.match(principal)
	if r == nil {
		return nil
	}
	return slices.Clone(r.allowed[server])
}

// match finds the one rule that decides for principal: its exact id rule,
// else its longest matching id_prefix rule, else none.
func (p *Policy) match(principal string) *principalRule {
	if r, ok := p.exact[principal]; ok {
		return r
	}
	return p.matchPrefix(principal)
}

func (p *Policy) matchPrefix(principal string) *principalRule {
	for _, n := range p.prefixLens {
		if n > len(principal) {
			continue
		}
		if r, ok := p.prefixes[principal[:n]]; ok {
			return r
		}
	}
	return nil
}
