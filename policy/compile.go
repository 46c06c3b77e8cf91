package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/gowebpki/jcs"
)

// Compile validates a policy file and builds the policy it describes: every
// constraint compiled and every (principal rule, tool) decision and its
// digest worked out, so that deciding a call is lookups only. Its errors name
// the offending field, e.g. tools[2].constraints[0].expr.
func Compile(f File) (*Policy, error) {
	p := &Policy{
		tools:    map[toolKey]*tool{},
		exact:    map[string]*principalRule{},
		prefixes: map[string]*principalRule{},
		lockfile: f.Lockfile,
	}
	if err := p.compileTools(f.Tools); err != nil {
		return nil, err
	}
	lens := map[int]bool{}
	for i, pr := range f.Principals {
		r, err := p.compilePrincipal(fmt.Sprintf("principals[%d]", i), pr)
		if err != nil {
			return nil, err
		}
		if pr.ID != "" {
			p.exact[pr.ID] = r
		} else {
			p.prefixes[pr.IDPrefix] = r
			lens[len(pr.IDPrefix)] = true
		}
	}
	for n := range lens {
		p.prefixLens = append(p.prefixLens, n)
	}
	slices.Sort(p.prefixLens)
	slices.Reverse(p.prefixLens)
	canon, err := canonical(f)
	if err != nil {
		return nil, err
	}
	p.digest = digestOf(canon)
	return p, nil
}

func (p *Policy) compileTools(rules []ToolRule) error {
	for i, t := range rules {
		field := fmt.Sprintf("tools[%d]", i)
		if t.Server == "" || t.Tool == "" {
			return fmt.Errorf("%s: server and tool are required", field)
		}
		if t.Tool == Wildcard {
			return fmt.Errorf("%s.tool: %q cannot be classified; classify each tool", field, Wildcard)
		}
		effect, err := ParseEffectClass(t.Effect)
		if err != nil {
			return fmt.Errorf("%s.effect: %w", field, err)
		}
		k := toolKey{t.Server, t.Tool}
		if _, dup := p.tools[k]; dup {
			return fmt.Errorf("%s: %s is classified twice", field, k)
		}
		caps, err := tagSet(field+".capabilities", t.Capabilities)
		if err != nil {
			return err
		}
		constraints, err := compileConstraints(field+".constraints", t.Constraints)
		if err != nil {
			return err
		}
		budgets, rateLimits, err := compileLimits(field, t.Budgets, t.RateLimits, false, "tool", t.Server, t.Tool)
		if err != nil {
			return err
		}
		approval, err := compileApproval(field+".approval", t.Approval)
		if err != nil {
			return err
		}
		p.tools[k] = &tool{key: k, field: field, effect: effect, capabilities: caps, constraints: constraints, budgets: budgets, rateLimits: rateLimits, approval: approval}
	}
	// After refers to other tools, so it is checked once all are known.
	for i, t := range rules {
		field := fmt.Sprintf("tools[%d].after", i)
		ct := p.tools[toolKey{t.Server, t.Tool}]
		ct.after = []string{}
		for j, a := range t.After {
			if a == "" {
				return fmt.Errorf("%s[%d]: empty tool name", field, j)
			}
			if _, ok := p.tools[toolKey{t.Server, a}]; !ok {
				return fmt.Errorf("%s[%d]: %s/%s is not classified under tools (after names tools of the same server)", field, j, t.Server, a)
			}
			if !slices.Contains(ct.after, a) {
				ct.after = append(ct.after, a)
			}
			p.tools[toolKey{t.Server, a}].precedes = true
		}
		slices.Sort(ct.after)
	}
	return p.checkAfterCycles(rules)
}

// checkAfterCycles refuses a sequence rule that no call could ever satisfy:
// a tool that must follow itself, directly or through others.
func (p *Policy) checkAfterCycles(rules []ToolRule) error {
	const (
		unvisited = iota
		visiting
		done
	)
	state := map[toolKey]int{}
	var path []string
	var visit func(k toolKey) []string
	visit = func(k toolKey) []string {
		state[k] = visiting
		path = append(path, k.tool)
		for _, a := range p.tools[k].after {
			next := toolKey{k.server, a}
			switch state[next] {
			case visiting:
				start := slices.Index(path, a)
				return append(slices.Clone(path[start:]), a)
			case unvisited:
				if cycle := visit(next); cycle != nil {
					return cycle
				}
			}
		}
		path = path[:len(path)-1]
		state[k] = done
		return nil
	}
	// In file order, so that the same file always reports the same cycle.
	for i, t := range rules {
		k := toolKey{t.Server, t.Tool}
		if state[k] != unvisited {
			continue
		}
		path = path[:0]
		if cycle := visit(k); cycle != nil {
			return fmt.Errorf("tools[%d].after: %s: %s is a cycle, so no call could satisfy it", i, t.Server, strings.Join(cycle, " → "))
		}
	}
	return nil
}

func (p *Policy) compilePrincipal(field string, pr PrincipalRule) (*principalRule, error) {
	r := &principalRule{field: field, outcomes: map[toolKey]*outcome{}, allowed: map[string][]string{}}
	switch {
	case pr.ID != "" && pr.IDPrefix != "":
		return nil, fmt.Errorf("%s: set one of id and id_prefix, not both", field)
	case strings.TrimSpace(pr.ID) == "" && strings.TrimSpace(pr.IDPrefix) == "":
		return nil, fmt.Errorf("%s.id: required, or else id_prefix", field)
	case pr.ID != "":
		if _, dup := p.exact[pr.ID]; dup {
			return nil, fmt.Errorf("%s.id: %q is listed twice", field, pr.ID)
		}
		r.name = "id:" + pr.ID
	default:
		if _, dup := p.prefixes[pr.IDPrefix]; dup {
			return nil, fmt.Errorf("%s.id_prefix: %q is listed twice", field, pr.IDPrefix)
		}
		r.name = "id_prefix:" + pr.IDPrefix
	}
	// named and wildcard record which grant decides each tool; a second
	// grant that could decide the same tool is an error, not a merge.
	named := map[toolKey]*grant{}
	wildcard := map[string]*grant{}
	for j, g := range pr.Grants {
		cg, err := p.compileGrant(fmt.Sprintf("%s.grants[%d]", field, j), g)
		if err != nil {
			return nil, err
		}
		r.grants = append(r.grants, cg)
		if cg.wildcard {
			if prev, dup := wildcard[cg.server]; dup {
				return nil, fmt.Errorf("%s.tools: %q on %s is already granted by %s", cg.field, Wildcard, cg.server, prev.field)
			}
			wildcard[cg.server] = cg
			continue
		}
		for _, t := range cg.names {
			k := toolKey{cg.server, t}
			if prev, dup := named[k]; dup {
				return nil, fmt.Errorf("%s.tools: %s is already named by %s", cg.field, k, prev.field)
			}
			named[k] = cg
		}
	}
	if err := checkSharedCounters(r.grants); err != nil {
		return nil, err
	}
	for k, t := range p.tools {
		g, via := named[k], k.tool
		if g == nil {
			g, via = wildcard[k.server], Wildcard
		}
		o, err := decideTool(r.name, t, g, via)
		if err != nil {
			return nil, err
		}
		if !o.granted {
			o.notGranted = fmt.Sprintf(" (rule %s) is not granted %s/%s: %s", r.name, k.server, k.tool, o.why)
		}
		r.outcomes[k] = o
		if o.granted {
			r.allowed[k.server] = append(r.allowed[k.server], k.tool)
		}
	}
	for _, names := range r.allowed {
		slices.Sort(names)
	}
	return r, nil
}

func (p *Policy) compileGrant(field string, g Grant) (*grant, error) {
	if g.Server == "" {
		return nil, fmt.Errorf("%s.server: required", field)
	}
	if len(g.Tools) == 0 {
		return nil, fmt.Errorf("%s.tools: at least one tool (or %q) is required", field, Wildcard)
	}
	cg := &grant{field: field, server: g.Server}
	for _, t := range g.Tools {
		switch {
		case t == "":
			return nil, fmt.Errorf("%s.tools: empty tool name", field)
		case t == Wildcard:
			if len(g.Tools) > 1 {
				return nil, fmt.Errorf("%s.tools: %q stands for every tool and cannot be listed with others", field, Wildcard)
			}
			cg.wildcard = true
		default:
			// A grant of an unclassified tool would never take effect;
			// it is almost always a typo the operator wants to hear about.
			if _, ok := p.tools[toolKey{g.Server, t}]; !ok {
				return nil, fmt.Errorf("%s.tools: %s/%s is not classified under tools", field, g.Server, t)
			}
			cg.names = append(cg.names, t)
		}
	}
	if g.MaxEffect != "" {
		c, err := ParseEffectClass(g.MaxEffect)
		if err != nil {
			return nil, fmt.Errorf("%s.max_effect: %w", field, err)
		}
		cg.maxEffect = c
	}
	var err error
	if cg.capabilities, err = tagSet(field+".capabilities", g.Capabilities); err != nil {
		return nil, err
	}
	if cg.constraints, err = compileConstraints(field+".constraints", g.Constraints); err != nil {
		return nil, err
	}
	if cg.budgets, cg.rateLimits, err = compileLimits(field, g.Budgets, g.RateLimits, true, "grant"); err != nil {
		return nil, err
	}
	return cg, nil
}

// compileLimits compiles the budgets and rate limits of a tool rule or (if
// onGrant) a grant at field, whose counters are scoped by scope. Their
// names are unique among them: a denial names one.
func compileLimits(field string, bs []Budget, rs []RateLimit, onGrant bool, scope ...string) ([]*Budget, []*RateLimit, error) {
	seen := map[string]string{}
	name := func(f, n string) error {
		if prev, dup := seen[n]; dup {
			return fmt.Errorf("%s.name: %q is already the name of %s", f, n, prev)
		}
		seen[n] = f
		return nil
	}
	var budgets []*Budget
	for i, b := range bs {
		f := fmt.Sprintf("%s.budgets[%d]", field, i)
		cb, err := compileBudget(f, b, scope...)
		if err != nil {
			return nil, nil, err
		}
		if err := name(f, b.Name); err != nil {
			return nil, nil, err
		}
		budgets = append(budgets, cb)
	}
	var rateLimits []*RateLimit
	for i, r := range rs {
		f := fmt.Sprintf("%s.rate_limits[%d]", field, i)
		cr, err := compileRateLimit(f, r, onGrant, scope...)
		if err != nil {
			return nil, nil, err
		}
		if err := name(f, r.Name); err != nil {
			return nil, nil, err
		}
		rateLimits = append(rateLimits, cr)
	}
	return budgets, rateLimits, nil
}

// checkSharedCounters refuses two grants of one principal rule whose
// budgets or rate limits of one name (one counter per principal) count
// differently: which limit would hold?
func checkSharedCounters(grants []*grant) error {
	seen := map[string]*counter{}
	check := func(c *counter, per string) error {
		prev, ok := seen[c.name]
		if !ok {
			seen[c.name] = c
			return nil
		}
		if prev.kind != c.kind || prev.limit != c.limit || prev.span != c.span || prev.perTool != c.perTool {
			return fmt.Errorf("%s: %q is also the name of %s, which counts otherwise; grants of one rule share a counter by name, so give both the same kind, limit, window%s, or different names", c.field, c.name, prev.field, per)
		}
		return nil
	}
	for _, g := range grants {
		for _, b := range g.budgets {
			if err := check(&b.c, ""); err != nil {
				return err
			}
		}
		for _, r := range g.rateLimits {
			if err := check(&r.c, " and per"); err != nil {
				return err
			}
		}
	}
	return nil
}

// decideTool works out what rule says about t given the grant that decides
// it (nil if none), named directly or through via "*".
func decideTool(rule string, t *tool, g *grant, via string) (*outcome, error) {
	if g == nil {
		return &outcome{why: "it is in no grant"}, nil
	}
	o := &outcome{grant: g}
	if g.maxEffect != 0 && t.effect > g.maxEffect {
		o.why = fmt.Sprintf("it is %s, above its grant's max_effect %s", t.effect, g.maxEffect)
		return o, nil
	}
	if missing := missingTags(t.capabilities, g.capabilities); len(missing) > 0 {
		o.why = "its grant lacks capabilities " + strings.Join(missing, ",")
		return o, nil
	}
	digest, err := decisionDigest(rule, t, g, via)
	if err != nil {
		return nil, err
	}
	o.granted = true
	o.decision = Decision{
		Effect:       t.effect,
		Digest:       digest,
		Rule:         rule,
		Constraints:  slices.Concat(t.constraints, g.constraints),
		After:        t.after,
		Precedes:     t.precedes,
		Capabilities: t.capabilities,
		RateLimits:   slices.Concat(t.rateLimits, g.rateLimits),
		Budgets:      slices.Concat(t.budgets, g.budgets),
	}
	for _, c := range o.decision.Constraints {
		o.decision.Terms = append(o.decision.Terms, c)
	}
	// A rate limit before a budget: a call it denies then never holds
	// budget another call could have had, even for the moment before
	// it is given back.
	for _, r := range o.decision.RateLimits {
		o.decision.Terms = append(o.decision.Terms, r)
	}
	for _, b := range o.decision.Budgets {
		o.decision.Terms = append(o.decision.Terms, b)
	}
	if s := sequenceOf(t); s != nil {
		o.decision.Terms = append(o.decision.Terms, s)
	}
	// Last: a person's approval is used only once nothing else can deny
	// the call, and cannot be given back.
	if t.approval != nil {
		o.decision.Approval = t.approval
		o.decision.Terms = append(o.decision.Terms, t.approval)
	}
	return o, nil
}

// missingTags lists the tags of need that have does not: the capability
// subset check of the second seed. Both are sorted and distinct.
func missingTags(need, have []string) []string {
	var missing []string
	for _, tag := range need {
		if _, ok := slices.BinarySearch(have, tag); !ok {
			missing = append(missing, tag)
		}
	}
	return missing
}

// tagSet validates capability tags and returns them sorted and distinct
// (never nil, so that a digest spells "none" one way).
func tagSet(field string, tags []string) ([]string, error) {
	out := []string{}
	for i, tag := range tags {
		if strings.TrimSpace(tag) == "" {
			return nil, fmt.Errorf("%s[%d]: empty capability tag", field, i)
		}
		out = append(out, tag)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// The digested form of the rules behind one decision. Field names are
// part of every pinned digest: changing them drift-denies every snapshot.
type (
	digestedConstraint struct {
		Name    string `json:"name"`
		Expr    string `json:"expr"`
		Message string `json:"message"`
	}
	// A budget's and a rate limit's window is digested as counted, so
	// that 24h and 1440m are one window.
	digestedBudget struct {
		Name   string  `json:"name"`
		Amount string  `json:"amount"`
		Limit  float64 `json:"limit"`
		Window string  `json:"window"`
	}
	digestedRateLimit struct {
		Name   string  `json:"name"`
		Limit  float64 `json:"limit"`
		Window string  `json:"window"`
		Per    string  `json:"per"`
	}
	// Budgets and rate limits are omitted when there are none, so that a
	// policy without them keeps the digests it had before they existed.
	digestedTool struct {
		Server       string               `json:"server"`
		Tool         string               `json:"tool"`
		Effect       string               `json:"effect"`
		Capabilities []string             `json:"capabilities"`
		After        []string             `json:"after"`
		Constraints  []digestedConstraint `json:"constraints"`
		Budgets      []digestedBudget     `json:"budgets,omitempty"`
		RateLimits   []digestedRateLimit  `json:"rate_limits,omitempty"`
		Approval     *digestedApproval    `json:"approval,omitempty"`
	}
	digestedApproval struct {
		When        string   `json:"when"`
		Approvers   []string `json:"approvers"`
		TTL         string   `json:"ttl"`
		SelfApprove bool     `json:"self_approve"`
	}
	digestedGrant struct {
		Rule         string               `json:"rule"`
		Server       string               `json:"server"`
		Tool         string               `json:"tool"`
		MaxEffect    string               `json:"max_effect"`
		Capabilities []string             `json:"capabilities"`
		Constraints  []digestedConstraint `json:"constraints"`
		Budgets      []digestedBudget     `json:"budgets,omitempty"`
		RateLimits   []digestedRateLimit  `json:"rate_limits,omitempty"`
	}
)

func digestedBudgets(bs []*Budget) []digestedBudget {
	var out []digestedBudget
	for _, b := range bs {
		out = append(out, digestedBudget{Name: b.Name, Amount: b.Amount, Limit: b.Limit, Window: b.c.span.String()})
	}
	return out
}

func digestedRateLimits(rs []*RateLimit) []digestedRateLimit {
	var out []digestedRateLimit
	for _, r := range rs {
		out = append(out, digestedRateLimit{Name: r.Name, Limit: r.Limit, Window: r.c.span.String(), Per: r.Per})
	}
	return out
}

func digestedApprovalOf(a *ApprovalRule) *digestedApproval {
	if a == nil {
		return nil
	}
	return &digestedApproval{When: a.When, Approvers: slices.Sorted(slices.Values(a.Approvers)), TTL: a.ttl.String(), SelfApprove: a.SelfApprove}
}

func digestedConstraints(cs []*Constraint) []digestedConstraint {
	out := make([]digestedConstraint, 0, len(cs))
	for _, c := range cs {
		out = append(out, digestedConstraint{Name: c.Name, Expr: c.Expr, Message: c.Message})
	}
	return out
}

// decisionDigest is the digest of exactly the rules that decide (rule, t):
// nothing about other tools, other grants or rule order enters it.
func decisionDigest(rule string, t *tool, g *grant, via string) (string, error) {
	maxEffect := ""
	if g.maxEffect != 0 {
		maxEffect = g.maxEffect.String()
	}
	canon, err := canonical(struct {
		Tool  digestedTool  `json:"tool"`
		Grant digestedGrant `json:"grant"`
	}{
		Tool: digestedTool{
			Server: t.key.server, Tool: t.key.tool, Effect: t.effect.String(),
			Capabilities: t.capabilities, After: t.after, Constraints: digestedConstraints(t.constraints),
			Budgets: digestedBudgets(t.budgets), RateLimits: digestedRateLimits(t.rateLimits),
			Approval: digestedApprovalOf(t.approval),
		},
		Grant: digestedGrant{
			Rule: rule, Server: g.server, Tool: via, MaxEffect: maxEffect,
			Capabilities: g.capabilities, Constraints: digestedConstraints(g.constraints),
			Budgets: digestedBudgets(g.budgets), RateLimits: digestedRateLimits(g.rateLimits),
		},
	})
	if err != nil {
		return "", err
	}
	return digestOf(canon), nil
}

func canonical(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("policy digest: %w", err)
	}
	out, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("policy digest: %w", err)
	}
	return out, nil
}

func digestOf(canon []byte) string {
	sum := sha256.Sum256(canon)
	return "sha256:" + hex.EncodeToString(sum[:])
}
