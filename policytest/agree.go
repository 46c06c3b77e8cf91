package policytest

import (
	"fmt"
	"slices"
	"strings"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/policy"
)

// beforeRules are the reasons the core denies a call for before the
// policy's rules are asked, on a server's tools/list, which explain does
// not read: a call denied for one is not explain's to have foreseen.
var beforeRules = []deny.Reason{deny.InvalidArguments, deny.UnknownTool}

// disagreement says how the core's decision on a call (denial, nil for an
// allow) contradicts explain's verdict on it, "" if it does not. A call
// explain denies must be denied, for a reason explain gives: one of its
// denials', or one it leaves to what the store holds, which the core may
// come to first. A call explain does not deny must be allowed, or denied
// for one of the reasons it leaves to the store.
func disagreement(v policy.Verdict, denial *deny.Error) string {
	if denial != nil && slices.Contains(beforeRules, denial.Reason) {
		return ""
	}
	switch {
	case len(v.Denials) > 0 && denial == nil:
		return said(v) + "; the decision core allowed it"
	case denial == nil:
		return ""
	case slices.Contains(v.Otherwise, denial.Reason):
		return ""
	case slices.ContainsFunc(v.Denials, func(d policy.Denial) bool { return d.Reason == denial.Reason }):
		return ""
	}
	return fmt.Sprintf("%s; the decision core denied it %s", said(v), denial.Reason)
}

// said is what explain said of a call, for people.
func said(v policy.Verdict) string {
	var denials []string
	for _, d := range v.Denials {
		denials = append(denials, fmt.Sprintf("%s: %s", d.Reason, d.Rule))
	}
	var otherwise []string
	for _, r := range v.Otherwise {
		otherwise = append(otherwise, string(r))
	}
	switch {
	case len(denials) > 0:
		return "explain denies it (" + strings.Join(denials, ", ") + ")"
	case len(otherwise) > 1:
		last := len(otherwise) - 1
		return "explain allows it unless " + strings.Join(otherwise[:last], ", ") + " or " + otherwise[last]
	case len(otherwise) == 1:
		return "explain allows it unless " + otherwise[0]
	}
	return "explain allows it"
}
