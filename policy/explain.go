package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/capsnap/capsnap/deny"
)

// Explain says, in lines a person reads, how the policy decides principal
// calling tool on server with args at time at: the principal rule that
// applies, the tool's effect class, whether and by which grant it is
// granted or why not, then each kind's rules (Applied.Explain: each
// constraint and whether it holds, each rate limit and budget and what the
// call would take, ...) and the decision digest. With nil args what reads
// the arguments is listed, not evaluated; no counter or log is read, so
// whether a limit has room is left to the call.
func (p *Policy) Explain(principal, server, toolName string, args map[string]any, at time.Time) []string {
	lines, _ := p.explain(principal, server, toolName, args, at)
	return lines
}

// Verdict is how Explain concludes, for a program that holds the decision
// core to it (capsnap policy test): a call it denies must be denied, for
// one of the reasons of Denials or Otherwise (what the store holds may
// deny it first); one it does not deny must be allowed, or denied for one
// of Otherwise.
type Verdict struct {
	// Denials are the rules that deny the call whatever the store holds,
	// in the order Explain names them; for a tool the principal is not
	// granted, the one denial that says so.
	Denials []Denial
	// Otherwise are the reasons the rules may yet deny it for, each once,
	// in the kinds' order (Explanation.Otherwise).
	Otherwise []deny.Reason
}

// Verdict is Explain's conclusion on the same call.
func (p *Policy) Verdict(principal, server, toolName string, args map[string]any, at time.Time) Verdict {
	_, v := p.explain(principal, server, toolName, args, at)
	return v
}

func (p *Policy) explain(principal, server, toolName string, args map[string]any, at time.Time) ([]string, Verdict) {
	k := toolKey{server, toolName}
	var out []string
	r := p.match(principal)
	if r == nil {
		out = append(out, fmt.Sprintf("principal %q matches no principal rule", principal))
	} else {
		out = append(out, fmt.Sprintf("principal %q is decided by rule %s (%s)", principal, r.name, r.field))
	}
	t, classified := p.tools[k]
	if !classified {
		v := Verdict{Denials: []Denial{{k.String(), deny.UnclassifiedTool}}}
		return append(out, fmt.Sprintf("%s is not classified, so it has no effect class: denied (%s)", k, deny.UnclassifiedTool)), v
	}
	out = append(out, fmt.Sprintf("%s is %s (%s) and exercises %s", k, t.effect, t.field, tagList(t.capabilities)))
	if r == nil {
		v := Verdict{Denials: []Denial{{"principals", deny.ToolNotGranted}}}
		return append(out, fmt.Sprintf("denied (%s): no principal rule matches", deny.ToolNotGranted)), v
	}
	o := r.outcomes[k]
	if !o.granted {
		where, rule := "", r.field
		if o.grant != nil {
			where, rule = " ("+o.grant.field+")", o.grant.field
		}
		v := Verdict{Denials: []Denial{{rule, deny.ToolNotGranted}}}
		return append(out, fmt.Sprintf("denied (%s): %s%s", deny.ToolNotGranted, o.why, where)), v
	}
	out = append(out, "granted by "+o.grant.describe(k.tool))

	call := Call{Input: Input{Args: args, Principal: principal, Server: server, Tool: toolName}, Now: at}
	var v Verdict
	var unless, decides []string
	for _, a := range o.decision.applied {
		e := a.Explain(call)
		out = append(out, e.Lines...)
		v.Denials = append(v.Denials, e.Denials...)
		for _, reason := range e.Otherwise {
			if !slices.Contains(v.Otherwise, reason) {
				v.Otherwise = append(v.Otherwise, reason)
			}
		}
		if e.Unless != "" {
			unless = append(unless, e.Unless)
		}
		if e.Decides != "" {
			decides = append(decides, e.Decides)
		}
	}
	out = append(out, "decision digest "+o.decision.Digest)
	switch {
	case len(v.Denials) > 0:
		out = append(out, "denied "+denialList(v.Denials))
	case len(decides) > 0:
		out = append(out, "granted; its "+list(decides)+" decide each call")
	case len(unless) > 0:
		out = append(out, "allowed, if "+list(unless))
	default:
		out = append(out, "allowed")
	}
	return out, v
}

// denialList says which rules deny, grouped by reason in order:
// "(constraint_violation): usd_cap, reason_allowlist".
func denialList(ds []Denial) string {
	var groups []string
	var rules []string
	for i, d := range ds {
		rules = append(rules, d.Rule)
		if i == len(ds)-1 || ds[i+1].Reason != d.Reason {
			groups = append(groups, fmt.Sprintf("(%s): %s", d.Reason, strings.Join(rules, ", ")))
			rules = nil
		}
	}
	return strings.Join(groups, "; ")
}

// list joins items as a sentence does: "a, b and c".
func list(items []string) string {
	if len(items) == 1 {
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

// describe says what a grant grants, as it applies to tool.
func (g *grant) describe(tool string) string {
	via := fmt.Sprintf("%q", tool)
	if g.wildcard {
		via = fmt.Sprintf("%q (every classified tool of %s)", Wildcard, g.server)
	}
	ceiling := "no max_effect"
	if g.maxEffect != 0 {
		ceiling = "max_effect " + g.maxEffect.String()
	}
	return fmt.Sprintf("%s: %s on %s, %s, confers %s", g.field, via, g.server, ceiling, tagList(g.capabilities))
}

func tagList(tags []string) string {
	if len(tags) == 0 {
		return "no capabilities"
	}
	return "capabilities " + strings.Join(tags, ",")
}
