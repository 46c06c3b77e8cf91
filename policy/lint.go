package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/capsnap/capsnap/internal/spelling"
)

// Lint lists, sorted, what in a valid policy is probably not what the
// operator meant, each naming its field: a classified tool no rule grants, a
// rule with no grants, a named tool its own grant does not grant, a
// max_effect that excludes everything its grant names, a "*" that decides
// no tool, a capability no tool exercises, a tool granted without the tool
// it must follow, and a grant's rule that reads an argument (a
// constraint, a budget's amount) while applying to several tools (a call to one without that
// argument is denied). Whether the tools have the arguments the policy
// reads is LintArguments', which needs their input schemas.
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
			for _, a := range o.decision.applied {
				n, ok := a.(needing)
				if !ok {
					continue
				}
				for _, first := range n.needs() {
					if !r.outcomes[toolKey{k.server, first}].granted {
						out = append(out, fmt.Sprintf("%s: grants %s but not %s/%s, which must be called first, so %s can never be called", r.field, k, k.server, first, k.tool))
					}
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
		for _, rd := range reads(g.rules) {
			for _, f := range rd.expr.read {
				out = append(out, fmt.Sprintf("%s: reads args.%s but applies to each of %s; a call without %s is denied (%s)", rd.Field, f, strings.Join(names, ", "), f, fmt.Sprintf(rd.Guard, f)))
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

// InputSchemas looks up the inputSchema of a tool as its server lists it
// (from a catalog file, the live server, or a lockfile's definition): ok
// is false for a tool the server does not list.
type InputSchemas func(server, tool string) (schema json.RawMessage, ok bool)

// LintArguments lists, sorted, each argument a constraint or budget amount
// reads (args.x, or args["x"]) that the input schema of a tool it applies
// to does not declare: the typo that passes every other check and denies
// every call at run time (args.amount on a tool whose field is
// amount_usd). An argument read outright must be declared by every tool
// the expression applies to; one only tested with has(), by at least one.
// Each finding is an error unless the operator says otherwise: what it
// reports cannot be what was meant. A tool schemas does not list, or whose
// schema declares its properties in a way this does not follow ($ref,
// patternProperties, an additionalProperties schema), is not checked.
func LintArguments(p *Policy, schemas InputSchemas) []string {
	declared := map[toolKey]map[string]bool{}
	known := func(k toolKey) (map[string]bool, bool) {
		props, seen := declared[k]
		if !seen {
			props = nil
			if raw, ok := schemas(k.server, k.tool); ok {
				props, _ = properties(raw)
			}
			declared[k] = props
		}
		return props, props != nil
	}
	var out []string
	// check holds the expression at field to the tools it applies to.
	check := func(field string, e *expression, tools []toolKey) {
		for _, f := range e.read {
			for _, k := range tools {
				if props, ok := known(k); ok && !props[f] {
					out = append(out, fmt.Sprintf("%s: reads args.%s, which the input schema of %s does not declare (it declares %s): every call is denied", field, f, k, propertyList(props)))
				}
			}
		}
		for _, f := range e.tested {
			checked, found := 0, false
			for _, k := range tools {
				if props, ok := known(k); ok {
					checked++
					found = found || props[f]
				}
			}
			if checked == len(tools) && checked > 0 && !found {
				out = append(out, fmt.Sprintf("%s: tests args.%s, which the input schema of no tool it applies to (%s) declares", field, f, keyList(tools)))
			}
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(p.tools), compareKeys) {
		for _, rd := range reads(p.tools[k].rules) {
			check(rd.Field, rd.expr, []toolKey{k})
		}
	}
	for _, r := range p.rules() {
		for _, g := range r.grants {
			var granted []toolKey
			for k, o := range r.outcomes {
				if o.granted && o.grant == g {
					granted = append(granted, k)
				}
			}
			slices.SortFunc(granted, compareKeys)
			if len(granted) == 0 {
				continue
			}
			for _, rd := range reads(g.rules) {
				check(rd.Field, rd.expr, granted)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// reads are what a site's rules of every kind read of the call.
func reads(rules []Rules) []Reading {
	var out []Reading
	for _, r := range rules {
		if r != nil {
			out = append(out, r.Reads()...)
		}
	}
	return out
}

// needing is what a kind's rules say about a call when they need other
// tools of its server granted too: after's, the tools called first.
type needing interface{ needs() []string }

// objectSchema is what properties reads of an input schema.
type objectSchema struct {
	Ref                  string                     `json:"$ref"`
	DynamicRef           string                     `json:"$dynamicRef"`
	Properties           map[string]json.RawMessage `json:"properties"`
	PatternProperties    map[string]json.RawMessage `json:"patternProperties"`
	AdditionalProperties json.RawMessage            `json:"additionalProperties"`
	AllOf                []json.RawMessage          `json:"allOf"`
	AnyOf                []json.RawMessage          `json:"anyOf"`
	OneOf                []json.RawMessage          `json:"oneOf"`
}

// properties are the argument names an input schema declares, at its top
// or in the schemas it combines with allOf, anyOf or oneOf; ok is false if
// it may declare others this cannot read.
func properties(raw json.RawMessage) (map[string]bool, bool) {
	out := map[string]bool{}
	var walk func(raw json.RawMessage) bool
	walk = func(raw json.RawMessage) bool {
		var s objectSchema
		if err := json.Unmarshal(raw, &s); err != nil {
			return string(bytes.TrimSpace(raw)) == "true"
		}
		extra := string(bytes.TrimSpace(s.AdditionalProperties))
		if s.Ref != "" || s.DynamicRef != "" || len(s.PatternProperties) > 0 || (extra != "" && extra != "true" && extra != "false" && extra != "{}") {
			return false
		}
		for name := range s.Properties {
			out[name] = true
		}
		for _, sub := range slices.Concat(s.AllOf, s.AnyOf, s.OneOf) {
			if !walk(sub) {
				return false
			}
		}
		return true
	}
	if len(raw) == 0 || !walk(raw) {
		return nil, false
	}
	return out, true
}

func propertyList(props map[string]bool) string {
	if len(props) == 0 {
		return "no properties"
	}
	return strings.Join(slices.Sorted(maps.Keys(props)), ", ")
}

func keyList(keys []toolKey) string {
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = k.String()
	}
	return strings.Join(names, ", ")
}

// LintServers lists, sorted, what in the policy names a server or tool
// that capsnap will not see, each naming its field, with the name probably
// meant: a tool classified, or a grant made, on a server id the
// configuration does not have (it never applies, and the server meant has
// no such rule); and, on each server whose tools listed knows (a catalog
// file or the live list), a classified tool the server does not list (no
// call reaches it, and the tool meant, if renamed, is unclassified). Each
// finding is an error: none can be what was meant.
func LintServers(p *Policy, servers []string, listed func(server string) (tools []string, ok bool)) []string {
	var out []string
	unknown := func(field, server string) {
		if slices.Contains(servers, server) {
			return
		}
		msg := fmt.Sprintf("%s: server %q is not configured (servers are %s)", field, server, strings.Join(servers, ", "))
		if best := spelling.Closest(server, servers); best != "" {
			msg = fmt.Sprintf("%s: server %q is not configured (did you mean %q?)", field, server, best)
		}
		out = append(out, msg)
	}
	for _, k := range slices.SortedFunc(maps.Keys(p.tools), compareKeys) {
		t := p.tools[k]
		unknown(t.field, k.server)
		names, ok := listed(k.server)
		if !ok || slices.Contains(names, k.tool) {
			continue
		}
		msg := fmt.Sprintf("%s: %s is classified, but server %s does not list %s", t.field, k, k.server, k.tool)
		if best := spelling.Closest(k.tool, names); best != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", best)
		}
		out = append(out, msg)
	}
	for _, r := range p.rules() {
		for _, g := range r.grants {
			unknown(g.field, g.server)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
