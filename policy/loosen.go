package policy

import (
	"fmt"
	"slices"
)

// Loosenings lists, sorted, every way next is looser than old; none means
// next allows nothing old did not, on no looser terms. It is what refuses a
// hot reload that would silently raise a cap or widen a grant. Counted as
// loosening:
//
//   - a principal who may call a (server, tool) under next but not under
//     old: a new grant or principal rule, a higher max_effect, more granted
//     capabilities, fewer capabilities required, a newly classified tool
//     under "*", or a rule removed so that a broader one now decides;
//   - a tool's effect class lowered;
//   - for a call allowed under both, a constraint of old missing from next
//     or changed in any way (any edit of an expression or message counts:
//     whether "<= 300" is looser than "<= 250" is not decided by reading
//     CEL), or an after requirement dropped;
//   - for a call allowed under both, a budget or rate limit of old (by
//     name, on the tool or on the grant) missing from next (removed, or
//     renamed: a new name is a new counter, from nothing), its limit
//     raised, its window shortened (the same limit over less time allows
//     more a day), a budget's amount changed in any way, or a rate limit
//     counted per tool that was counted per principal;
//   - the lockfile removed or pointing elsewhere.
//
// Tightening (a grant, rule or tool removed, a constraint added, a lower
// ceiling) is not loosening.
func Loosenings(old, next *Policy) []string {
	var out []string
	switch {
	case old.lockfile == "":
	case next.lockfile == "":
		out = append(out, fmt.Sprintf("lockfile: removed (was %s)", old.lockfile))
	case next.lockfile != old.lockfile:
		out = append(out, fmt.Sprintf("lockfile: now %s (was %s)", next.lockfile, old.lockfile))
	}
	out = append(out, looserChanges(old, next)...)
	for k, ot := range old.tools {
		if nt, ok := next.tools[k]; ok && nt.effect < ot.effect {
			out = append(out, fmt.Sprintf("%s: effect class lowered from %s to %s", k, ot.effect, nt.effect))
		}
	}
	for _, w := range witnesses(old, next) {
		oldRule, nextRule := w.resolve(old), w.resolve(next)
		if nextRule == nil {
			continue
		}
		for k, no := range nextRule.outcomes {
			if !no.granted {
				continue
			}
			before := "no principal rule matched"
			var oo *outcome
			if oldRule != nil {
				if oo = oldRule.outcomes[k]; oo == nil {
					before = "the tool was not classified"
				} else {
					before = oldRule.name + ": " + oo.why
				}
			}
			if oo == nil || !oo.granted {
				out = append(out, fmt.Sprintf("%s: may now call %s under %s (before, %s)", w.label, k, nextRule.name, before))
				continue
			}
			for _, s := range looserTerms(oo.decision, no.decision) {
				out = append(out, fmt.Sprintf("%s: %s: %s", w.label, k, s))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// looserTerms lists how the terms of an allowed call got looser, kind by
// kind.
func looserTerms(old, next Decision) []string {
	var out []string
	for i, a := range old.applied {
		out = append(out, a.Looser(next.applied[i])...)
	}
	return out
}

// looserLimits lists how the budgets or rate limits of old count more
// loosely in next, each matched to its counter: removed, a higher limit,
// a shorter window, and what also says of the kind.
func looserLimits[L any](old, next []L, counts func(L) *counter, also func(old, next L) []string) []string {
	var out []string
	for _, o := range old {
		oc := counts(o)
		i := slices.IndexFunc(next, func(n L) bool { return oc.same(counts(n)) })
		if i < 0 {
			out = append(out, fmt.Sprintf("%s (%s) removed", oc.what(), oc.describe()))
			continue
		}
		out = append(out, oc.looser(counts(next[i]))...)
		out = append(out, also(o, next[i])...)
	}
	return out
}

// A witness stands for a set of principals that every rule of two policies
// treats alike, so that comparing the policies for each witness compares
// them for every principal there is.
//
// An exact id of either policy is its own witness. Every other principal is
// decided, in each policy, by its longest matching id_prefix; if q is the
// longest prefix of either policy that matches it, that is the longest
// prefix of q in each policy, so q stands for all of them (such principals
// always exist: q followed by anything no longer prefix begins with). A
// principal that no prefix matches has no rule under either policy.
type witness struct {
	label  string
	id     string // set for an exact id
	prefix string // set for a prefix region
}

func (w witness) resolve(p *Policy) *principalRule {
	if w.id != "" {
		return p.match(w.id)
	}
	return p.matchPrefix(w.prefix)
}

func witnesses(old, next *Policy) []witness {
	var out []witness
	seen := map[witness]bool{}
	add := func(w witness) {
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	for _, p := range []*Policy{old, next} {
		for id := range p.exact {
			add(witness{label: fmt.Sprintf("principal %q", id), id: id})
		}
		for prefix := range p.prefixes {
			add(witness{label: fmt.Sprintf("principals under %q", prefix), prefix: prefix})
		}
	}
	return out
}
