package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/gowebpki/jcs"
	"go.yaml.in/yaml/v3"
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
	var err error
	if p.changes, err = p.compileChanges(f.Changes); err != nil {
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
	w, err := written(f)
	if err != nil {
		return nil, err
	}
	canon, err := canonical(w)
	if err != nil {
		return nil, err
	}
	p.digest = digestOf(canon)
	return p, nil
}

// omitted reports whether JSON's omitempty would leave v out.
func omitted(v any) bool {
	if v == nil {
		return true
	}
	r := reflect.ValueOf(v)
	switch r.Kind() {
	case reflect.Slice, reflect.Map, reflect.String:
		return r.Len() == 0
	}
	return r.IsZero()
}

// written is f as the operator wrote it, as JSON reads it: the rules of
// every kind included, empty ones left out.
func written(f File) (any, error) {
	raw, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("policy digest: %w", err)
	}
	var w struct {
		Lockfile   string           `json:"lockfile,omitempty"`
		Tools      []map[string]any `json:"tools"`
		Principals []struct {
			ID       string           `json:"id,omitempty"`
			IDPrefix string           `json:"id_prefix,omitempty"`
			Grants   []map[string]any `json:"grants"`
		} `json:"principals"`
		Changes []ChangeRule `json:"changes,omitempty"`
	}
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, fmt.Errorf("policy digest: %w", err)
	}
	add := func(m map[string]any, rules map[string]yaml.Node) error {
		for key, n := range rules {
			var v any
			if err := n.Decode(&v); err != nil {
				return fmt.Errorf("policy digest: %s: %w", key, err)
			}
			if !omitted(v) {
				m[key] = v
			}
		}
		return nil
	}
	for i, t := range f.Tools {
		if err := add(w.Tools[i], t.Rules); err != nil {
			return nil, err
		}
	}
	for i, pr := range f.Principals {
		for j, g := range pr.Grants {
			if err := add(w.Principals[i].Grants[j], g.Rules); err != nil {
				return nil, err
			}
		}
	}
	return w, nil
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
		compiled, err := compileRules(&Site{Field: field, Server: t.Server, Tool: t.Tool}, t.Rules)
		if err != nil {
			return err
		}
		p.tools[k] = &tool{key: k, field: field, effect: effect, capabilities: caps, rules: compiled}
		p.order = append(p.order, k)
	}
	// A kind whose rules refer to other tools checks them once all are
	// known.
	for i, k := range kinds {
		if l, ok := k.(linker); ok {
			if err := l.link(p, i); err != nil {
				return err
			}
		}
	}
	return nil
}

// A linker is a kind whose tool rules refer to other tools (after): it
// checks and links them, once every tool is compiled, through each tool's
// rules of its kind (tool.rules[i]).
type linker interface {
	link(p *Policy, i int) error
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
	// Grants of one rule share a budget's or rate limit's counter by name.
	shared := map[string]*counter{}
	for j, g := range pr.Grants {
		cg, err := p.compileGrant(fmt.Sprintf("%s.grants[%d]", field, j), g, shared)
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

func (p *Policy) compileGrant(field string, g Grant, shared map[string]*counter) (*grant, error) {
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
	if cg.rules, err = compileRules(&Site{Field: field, Server: g.Server, Grant: true, shared: shared}, g.Rules); err != nil {
		return nil, err
	}
	return cg, nil
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
	o.decision = Decision{Effect: t.effect, Digest: digest, Rule: rule, Capabilities: t.capabilities}
	for i, k := range kinds {
		a := k.Apply(t.rules[i], g.rules[i])
		o.decision.applied = append(o.decision.applied, a)
		o.decision.Terms = append(o.decision.Terms, a.Terms()...)
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

// decisionDigest is the digest of exactly the rules that decide (rule, t):
// nothing about other tools, other grants or rule order enters it. Its
// names are part of every pinned digest: changing them drift-denies every
// snapshot.
func decisionDigest(rule string, t *tool, g *grant, via string) (string, error) {
	maxEffect := ""
	if g.maxEffect != 0 {
		maxEffect = g.maxEffect.String()
	}
	tool := map[string]any{"server": t.key.server, "tool": t.key.tool, "effect": t.effect.String(), "capabilities": t.capabilities}
	grant := map[string]any{"rule": rule, "server": g.server, "tool": via, "max_effect": maxEffect, "capabilities": g.capabilities}
	for i, k := range kinds {
		for _, at := range []struct {
			m     map[string]any
			rules Rules
		}{{tool, t.rules[i]}, {grant, g.rules[i]}} {
			if at.rules == nil {
				continue
			}
			if v := at.rules.Digested(); v != nil {
				at.m[k.Key()] = v
			}
		}
	}
	canon, err := canonical(map[string]any{"tool": tool, "grant": grant})
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
