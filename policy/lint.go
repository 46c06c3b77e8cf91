package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Lint lists, sorted, what in a valid policy is probably not what the
// operator meant, each naming its field: a classified tool no rule grants, a
// rule with no grants, a named tool its own grant does not grant, a
// max_effect that excludes everything its grant names, a "*" that decides
// no tool, a capability no tool exercises, a tool granted without the tool
// it must follow, and a grant constraint that reads an argument while
// applying to several tools (a call to one without that argument is
// denied).
func Lint(p *Policy) []string {
	var out []string
	granted := map[toolKey]bool{}
	for _, r := range p.rules() {
		if len(r.grants) == 0 {
			out = append(out, fmt.Sprintf("%s.grants: %s grants nothing (fine if it is meant to deny every principal it matches)", r.field, r.name))
		}
		for _, g := range r.grants {
			out = append(out, p.lintGrant(r, g)...)
		}
		for k, o := range r.outcomes {
			if !o.granted {
				continue
			}
			granted[k] = true
			for _, a := range o.decision.After {
				if !r.outcomes[toolKey{k.server, a}].granted {
					out = append(out, fmt.Sprintf("%s: grants %s but not %s/%s, which must be called first, so %s can never be called", r.field, k, k.server, a, k.tool))
				}
			}
		}
	}
	for k, t := range p.tools {
		if !granted[k] {
			out = append(out, fmt.Sprintf("%s: %s is granted by no principal rule", t.field, k))
		}
	}
	slices.Sort(out)
	return out
}

func (p *Policy) lintGrant(r *principalRule, g *grant) []string {
	var out []string
	// decided are the tools this grant decides: its names, or for "*"
	// every classified tool of the server no other grant names.
	var decided, denied []toolKey
	aboveCeiling := 0
	exercised := map[string]bool{}
	for k, o := range r.outcomes {
		if k.server == g.server {
			for _, tag := range p.tools[k].capabilities {
				exercised[tag] = true
			}
		}
		if o.grant != g {
			continue
		}
		decided = append(decided, k)
		if !o.granted {
			denied = append(denied, k)
			if g.maxEffect != 0 && p.tools[k].effect > g.maxEffect {
				aboveCeiling++
			}
		}
	}
	slices.SortFunc(decided, compareKeys)
	slices.SortFunc(denied, compareKeys)
	switch {
	case len(decided) == 0:
		out = append(out, fmt.Sprintf("%s.tools: %q decides no tool: no tool of %s is classified, or another grant names each one", g.field, Wildcard, g.server))
	case aboveCeiling == len(decided):
		out = append(out, fmt.Sprintf("%s.max_effect: %s excludes every tool the grant names", g.field, g.maxEffect))
	case len(denied) == len(decided):
		out = append(out, fmt.Sprintf("%s: grants none of the tools it names (%s)", g.field, whyNot(r, denied)))
	case !g.wildcard && len(denied) > 0:
		out = append(out, fmt.Sprintf("%s.tools: names tools it does not grant (%s)", g.field, whyNot(r, denied)))
	}
	for _, tag := range g.capabilities {
		if !exercised[tag] {
			out = append(out, fmt.Sprintf("%s.capabilities: no tool of %s exercises %s", g.field, g.server, tag))
		}
	}
	if len(decided) > 1 {
		names := make([]string, len(decided))
		for i, k := range decided {
			names[i] = k.tool
		}
		for _, c := range g.constraints {
			for _, f := range c.expr.read {
				out = append(out, fmt.Sprintf("%s: reads args.%s but applies to each of %s; a call without %s is denied (guard it with has(args.%s), or move it to the tool)", c.field, f, strings.Join(names, ", "), f, f))
			}
		}
	}
	return out
}

func whyNot(r *principalRule, keys []toolKey) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k.String() + ": " + r.outcomes[k].why
	}
	return strings.Join(parts, "; ")
}

func compareKeys(a, b toolKey) int {
	return strings.Compare(a.String(), b.String())
}

// rules are every principal rule, exact ones first, each group sorted.
func (p *Policy) rules() []*principalRule {
	var out []*principalRule
	for _, m := range []map[string]*principalRule{p.exact, p.prefixes} {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			out = append(out, m[k])
		}
	}
	return out
}
