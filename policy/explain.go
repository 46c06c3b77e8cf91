package policy

import (
	"fmt"
	"strings"

	"github.com/capsnap/capsnap/deny"
)

// Explain says, in lines a person reads, how the policy decides principal
// calling tool on server: the principal rule that applies, the tool's effect
// class, whether and by which grant it is granted or why not, each
// constraint and whether it holds for args, each rate limit and budget and
// what the call would take, the sequence rules and the decision digest.
// With nil args the constraints and budgets are listed, not evaluated; no
// counter is read, so whether a limit has room is left to the call.
func (p *Policy) Explain(principal, server, toolName string, args map[string]any) []string {
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
		return append(out, fmt.Sprintf("%s is not classified, so it has no effect class: denied (%s)", k, deny.UnclassifiedTool))
	}
	out = append(out, fmt.Sprintf("%s is %s (%s) and exercises %s", k, t.effect, t.field, tagList(t.capabilities)))
	if r == nil {
		return append(out, fmt.Sprintf("denied (%s): no principal rule matches", deny.ToolNotGranted))
	}
	o := r.outcomes[k]
	if !o.granted {
		where := ""
		if o.grant != nil {
			where = " (" + o.grant.field + ")"
		}
		return append(out, fmt.Sprintf("denied (%s): %s%s", deny.ToolNotGranted, o.why, where))
	}
	out = append(out, "granted by "+o.grant.describe(k.tool))

	var failed []string
	if len(o.decision.Constraints) == 0 {
		out = append(out, "no constraints")
	}
	in := Input{Args: args, Principal: principal, Server: server, Tool: toolName}
	for _, c := range o.decision.Constraints {
		line := fmt.Sprintf("constraint %q (%s): %s: ", c.Name, c.field, c.Expr)
		message := ""
		if c.Message != "" {
			message = ": " + c.Message
		}
		if args == nil {
			out = append(out, line+"not evaluated, no arguments given")
			continue
		}
		switch holds, err := c.eval(in); {
		case err != nil:
			out = append(out, fmt.Sprintf("%sDOES NOT HOLD, its evaluation failed (%v)%s", line, err, message))
			failed = append(failed, c.Name)
		case !holds:
			out = append(out, line+"DOES NOT HOLD"+message)
			failed = append(failed, c.Name)
		default:
			out = append(out, line+"holds")
		}
	}
	limited := len(o.decision.RateLimits)+len(o.decision.Budgets) > 0
	if !limited {
		out = append(out, "no budgets or rate limits")
	}
	for _, r := range o.decision.RateLimits {
		out = append(out, fmt.Sprintf("rate limit %q (%s): at most %s", r.Name, r.c.field, r.c.describe()))
	}
	for _, b := range o.decision.Budgets {
		line := fmt.Sprintf("budget %q (%s): the sum of %s, at most %s: ", b.Name, b.c.field, b.Amount, b.c.describe())
		if args == nil {
			out = append(out, line+"not evaluated, no arguments given")
			continue
		}
		amount, err := b.amountOf(in)
		if err != nil {
			de, _ := deny.As(err)
			out = append(out, line+"DENIES THE CALL: "+de.Detail)
			failed = append(failed, b.Name)
			continue
		}
		out = append(out, line+"this call would take "+units(amount))
	}
	if len(o.decision.After) == 0 {
		out = append(out, "no sequence rule")
	} else {
		out = append(out, fmt.Sprintf("after: only once %s has been called, and allowed, under the same snapshot", strings.Join(o.decision.After, ", ")))
	}
	out = append(out, "decision digest "+o.decision.Digest)
	var unless []string
	if limited {
		unless = append(unless, "its budgets and rate limits have room")
	}
	if len(o.decision.After) > 0 {
		unless = append(unless, "the sequence rule is met")
	}
	switch {
	case len(failed) > 0:
		out = append(out, fmt.Sprintf("denied (%s): %s", deny.ConstraintViolation, strings.Join(failed, ", ")))
	case args == nil && len(o.decision.Budgets) > 0:
		out = append(out, "granted; its constraints and budgets decide each call")
	case args == nil && len(o.decision.Constraints) > 0:
		out = append(out, "granted; its constraints decide each call")
	case len(unless) > 0:
		out = append(out, "allowed, if "+strings.Join(unless, " and "))
	default:
		out = append(out, "allowed")
	}
	return out
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
