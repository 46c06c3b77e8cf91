// Change control: a tool under it is pinned only at an approved
// definition. A change the policy accepts is approved at once; any other
// waits for a reviewer, and the tool is withheld meanwhile.

package decide

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/internal/bounded"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/tooldiff"
)

// reviewApprovalTTL is how long an approved review waits to be applied by
// the next listing that sees its definition: long, since no one may list
// the tool for days, and the definition it binds is exact.
const reviewApprovalTTL = 30 * 24 * time.Hour

// changeGate admits the live definitions of one server's tools under
// change control, for one listing (or one call's explanation): it reads
// their states from the store once, and for each tool says whether its
// definition may be pinned.
type changeGate struct {
	s      *Server
	r      *Rules
	server string
	list   *catalog.List
	now    time.Time
	states map[string]store.ToolState
	// locked are the tools the lockfile pins: the lockfile, not change
	// control, decides those.
	locked map[string]bool
}

func (s *Server) changeGate(r *Rules, server string, list *catalog.List, now time.Time) *changeGate {
	return &changeGate{s: s, r: r, server: server, list: list, now: now, locked: lockedTools(r, server)}
}

// lockedTools are the tools of server the rules' lockfile pins.
func lockedTools(r *Rules, server string) map[string]bool {
	if r.Lock == nil {
		return nil
	}
	locked := map[string]bool{}
	for _, e := range r.Lock.Entries() {
		if e.ServerID == server {
			locked[e.Tool] = true
		}
	}
	return locked
}

// firstSight approves the definitions in list of the tools under change
// control (first_sight approve) that have none approved yet: what the
// server listed when capsnap first saw it, or when the rules put it under
// change control; never one a later change brings, which is compared with
// these. The catalog's first list, each change's list before it, and the
// rules put in force all come here; each replica may, and of two the
// first wins. A store that cannot answer now approves nothing: a tool
// without a record is approved, at the latest, by the next listing.
func (s *Server) firstSight(r *Rules, server string, list *catalog.List) {
	if list == nil {
		return
	}
	locked := lockedTools(r, server)
	var names []string
	for name := range list.Tools {
		if c := r.Policy.ChangeControl(server, name); c != nil && !c.Review && !locked[name] {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return
	}
	states, err := s.snapshots.ToolStates(server, names)
	if err != nil {
		return
	}
	for _, name := range names {
		if states[name].Approved != nil {
			continue
		}
		t := list.Tools[name]
		d := store.Definition{Digest: t.Digest, Definition: t.Definition, By: store.ByFirstSight, At: s.now()}
		if ok, err := s.snapshots.ApproveDefinition(server, name, "", d); err == nil && ok {
			s.auditLog.Log().Str("event", "definition_approved").Str("server_id", server).Str("tool", name).
				Str("from", "").Str("to", t.Digest).Str("by", store.ByFirstSight).Msg("definition")
		}
	}
}

// admit says why tool's live definition may not be pinned, nil if it may:
// it is approved; or it is the first the server lists and change control
// approves first sights; or the change from the approved one is accepted
// by the policy or was approved by a reviewer (approving it now, for every
// replica). Anything else is held (tool_under_review, with the review it
// waits on) or was rejected (tool_change_rejected). A store that cannot
// answer holds it too: a definition is never admitted unread.
func (g *changeGate) admit(tool string, rule policy.Decision) *deny.Error {
	c := g.r.Policy.ChangeControl(g.server, tool)
	live, ok := g.list.Tools[tool]
	if c == nil || g.locked[tool] || !ok {
		return nil
	}
	if g.states == nil {
		var names []string
		for name := range g.list.Tools {
			if g.r.Policy.ChangeControl(g.server, name) != nil {
				names = append(names, name)
			}
		}
		states, err := g.s.snapshots.ToolStates(g.server, names)
		if err != nil {
			return storeFailed(err)
		}
		g.states = states
	}
	st := g.states[tool]
	from := ""
	if st.Approved != nil {
		from = st.Approved.Digest
	}
	switch {
	case from == live.Digest:
		return nil
	case st.Approved == nil && !c.Review:
		return g.approve(tool, "", live, store.ByFirstSight, nil)
	}
	if r, rejected := st.Rejection(live.Digest); rejected {
		return rejectedChange(g.server, tool, r)
	}
	diff := g.s.diff(st.Approved, live)
	if st.Approved != nil && c.Accepts(kindsOf(diff), diff.Fields()) {
		return g.approve(tool, from, live, "policy:"+c.Rule, &diff)
	}
	return g.review(tool, from, live, c, rule, diff)
}

// approve makes live the tool's approved definition, from the approved
// digest from, for every replica, and audits it with the change.
func (g *changeGate) approve(tool, from string, live catalog.Tool, by string, diff *tooldiff.Diff) *deny.Error {
	d := store.Definition{Digest: live.Digest, Definition: live.Definition, By: by, At: g.now}
	ok, err := g.s.snapshots.ApproveDefinition(g.server, tool, from, d)
	if err != nil {
		return storeFailed(err)
	}
	if !ok {
		// Another replica changed it first: what it approved decides.
		states, err := g.s.snapshots.ToolStates(g.server, []string{tool})
		if err != nil {
			return storeFailed(err)
		}
		if a := states[tool].Approved; a != nil && a.Digest == live.Digest {
			g.states[tool] = states[tool]
			return nil
		}
		return deny.Errorf(deny.ToolUnderReview, "%s/%s changed while its definition was being approved; list again", g.server, tool)
	}
	g.states[tool] = store.ToolState{Approved: &d}
	ev := g.s.auditLog.Log().Str("event", "definition_approved").Str("server_id", g.server).Str("tool", tool).
		Str("from", from).Str("to", live.Digest).Str("by", by)
	if diff != nil {
		ev = ev.Strs("change", kindsOf(*diff)).Strs("fields", boundedFields(diff.Fields()))
	}
	ev.Msg("definition")
	return nil
}

// review opens (or finds) the review of the change to live and acts on
// its state: approved, the change is approved; rejected, it is recorded
// as rejected; pending, the tool waits on it.
func (g *changeGate) review(tool, from string, live catalog.Tool, c *policy.ChangeControl, rule policy.Decision, diff tooldiff.Diff) *deny.Error {
	if g.s.reviews == nil {
		return deny.Errorf(deny.ToolUnderReview, "%s/%s changed (%s) and waits for a reviewer, but capsnap serves no approvals (approvals.addr)", g.server, tool, strings.Join(kindsOf(diff), ", "))
	}
	fromDigest := from
	if fromDigest == "" {
		fromDigest = "none"
	}
	raw, err := boundedDiff(diff)
	if err != nil {
		return deny.Errorf(deny.ToolUnderReview, "%s/%s: the change cannot be shown: %v", g.server, tool, err)
	}
	def := string(live.Definition)
	if len(def) > approval.MaxChangeDefinition {
		def = def[:approval.MaxChangeDefinition]
	}
	// A server that keeps changing the tool opens a bounded number of
	// reviews; the rest wait, held, until those are decided or lapse.
	ok := g.states[tool].Reviews(live.Digest, g.now)
	if !ok {
		var err error
		if ok, err = g.s.snapshots.OpenReview(g.server, tool, live.Digest, g.now.Add(c.TTL), g.now); err != nil {
			return storeFailed(err)
		}
	}
	if !ok {
		return deny.Errorf(deny.ToolUnderReview, "the server changed %s/%s again (%s), and %d of its changes already wait for a reviewer: no review opens for this one until they are decided", g.server, tool, strings.Join(kindsOf(diff), ", "), store.MaxReviewing)
	}
	b := approval.Binding{Principal: approval.ChangeReviewer, Server: g.server, Tool: tool,
		SchemaDigest: live.Digest, PolicyDigest: fromDigest, ArgsDigest: "change"}
	req, err := g.s.reviews.Open(approval.Request{Binding: b,
		Change:      &approval.Change{From: from, To: live.Digest, Diff: raw, Definition: def, Granted: g.r.Policy.Granted(g.server, tool), Wait: c.TTL},
		EffectClass: rule.Effect.String(), Rule: c.Describe(), Approvers: c.Reviewers, ApprovalTTL: reviewApprovalTTL})
	if err != nil {
		return storeFailed(err)
	}
	switch req.State {
	case approval.Approved:
		if fail := g.approve(tool, from, live, req.DecidedBy, &diff); fail != nil {
			return fail
		}
		// Used: the trail says the review took effect, once.
		if _, _, err := g.s.reviews.Consume(b); err != nil {
			return storeFailed(err)
		}
		return nil
	case approval.Denied:
		r := store.Rejection{Digest: live.Digest, By: req.DecidedBy, Reason: req.Reason, At: req.DecidedAt}
		if err := g.s.snapshots.RejectDefinition(g.server, tool, r); err != nil {
			return storeFailed(err)
		}
		g.s.auditLog.Log().Str("event", "definition_rejected").Str("server_id", g.server).Str("tool", tool).
			Str("from", from).Str("to", live.Digest).Str("by", req.DecidedBy).Str("reason", req.Reason).Msg("definition")
		return rejectedChange(g.server, tool, r)
	}
	return &deny.Error{Reason: deny.ToolUnderReview,
		Review: &deny.ReviewInfo{ID: req.ID, URL: g.s.reviews.URL(req.ID), ExpiresAt: req.Expires},
		Detail: "the server changed " + g.server + "/" + tool + " (" + strings.Join(kindsOf(diff), ", ") + "): the change waits for a reviewer at " + g.s.reviews.URL(req.ID)}
}

func rejectedChange(server, tool string, r store.Rejection) *deny.Error {
	why := ""
	if r.Reason != "" {
		why = ": " + r.Reason
	}
	return deny.Errorf(deny.ToolChangeRejected, "%s rejected the definition %s/%s has now (%s)%s", r.By, server, tool, r.Digest, why)
}

// diffs keep the changes computed, by the digests they are from and to: a
// tool under review is compared again at every listing, and a long
// description costs real time to compare word by word.
type diffs = bounded.Map[[2]string, tooldiff.Diff]

const maxDiffs = 1024

// diff is definitionDiff, kept.
func (s *Server) diff(approved *store.Definition, live catalog.Tool) tooldiff.Diff {
	from := ""
	if approved != nil {
		from = approved.Digest
	}
	return s.diffs.Get([2]string{from, live.Digest}, maxDiffs, func() ([2]string, tooldiff.Diff) {
		return [2]string{from, live.Digest}, definitionDiff(approved, live)
	})
}

// definitionDiff is the change from the approved definition to live: a
// tool added, when none is approved yet. A definition tooldiff cannot read
// is a change of the whole schema.
func definitionDiff(approved *store.Definition, live catalog.Tool) tooldiff.Diff {
	next, err := tooldiff.Parse(live.Definition)
	if err != nil {
		return tooldiff.Diff{Changes: []tooldiff.Change{{Kind: tooldiff.InputSchemaChanged, Field: "inputSchema"}}}
	}
	if approved == nil {
		return tooldiff.Compare(nil, next)
	}
	prev, err := tooldiff.Parse(approved.Definition)
	if err != nil {
		return tooldiff.Diff{Changes: []tooldiff.Change{{Kind: tooldiff.InputSchemaChanged, Field: "inputSchema"}}}
	}
	return tooldiff.Compare(prev, next)
}

func kindsOf(d tooldiff.Diff) []string {
	kinds := d.Kinds()
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = string(k)
	}
	return out
}

// definitions keeps the definitions capsnap has seen by digest, for a
// drift denial to say what changed: bounded, as a catalog's changes are
// rare and a digest names one definition.
type definitions = bounded.Map[string, json.RawMessage]

const maxDefinitions = 4096

// remember keeps the definitions of list's tools named.
func (s *Server) remember(list *catalog.List, names []string) {
	if list == nil {
		return
	}
	for _, name := range names {
		if t, ok := list.Tools[name]; ok {
			s.definitions.Store(t.Digest, t.Definition, maxDefinitions)
		}
	}
}

// changeOf is what changed from the definition at digest to live, when
// capsnap has seen both.
func (s *Server) changeOf(server, tool, digest string, live catalog.Tool) *deny.ChangeInfo {
	prev, ok := s.definitions.Load(digest)
	if !ok {
		states, err := s.snapshots.ToolStates(server, []string{tool})
		if err != nil {
			return nil
		}
		a := states[tool].Approved
		if a == nil || a.Digest != digest {
			return nil
		}
		prev = a.Definition
	}
	diff := s.diff(&store.Definition{Digest: digest, Definition: prev}, live)
	return &deny.ChangeInfo{Kinds: kindsOf(diff), Fields: boundedFields(diff.Fields())}
}

// maxFields bounds the fields a change names in a denial and an audit
// line: a server that adds a thousand properties is still one line.
const maxFields = 64

// boundedFields is fields, at most maxFields, the last saying how many
// more there are.
func boundedFields(fields []string) []string {
	if len(fields) <= maxFields {
		return fields
	}
	return append(fields[:maxFields-1:maxFields-1], fmt.Sprintf("(and %d more)", len(fields)-maxFields+1))
}

// boundedDiff is diff as a review keeps it: whole when it fits in
// approval.MaxChangeDefinition, else without its values and words, else
// its first changes only. The reviewer always sees every kind of change
// the first changes name, and the definition itself.
func boundedDiff(diff tooldiff.Diff) (json.RawMessage, error) {
	raw, err := json.Marshal(diff)
	if err != nil || len(raw) <= approval.MaxChangeDefinition {
		return raw, err
	}
	bare := tooldiff.Diff{Changes: make([]tooldiff.Change, len(diff.Changes))}
	for i, c := range diff.Changes {
		bare.Changes[i] = tooldiff.Change{Kind: c.Kind, Field: c.Field}
	}
	for {
		if raw, err = json.Marshal(bare); err != nil || len(raw) <= approval.MaxChangeDefinition {
			return raw, err
		}
		bare.Changes = bare.Changes[:len(bare.Changes)/2]
	}
}

// removed audits each tool under change control that next no longer
// lists: a change too, though nothing is pinned by it.
func (s *Server) removed(r *Rules, server string, prev, next *catalog.List, changed []string) {
	if prev == nil {
		return
	}
	for _, name := range changed {
		t, was := prev.Tools[name]
		if _, is := next.Tools[name]; was && !is && r.Policy.ChangeControl(server, name) != nil {
			s.auditLog.Log().Str("event", "definition_removed").Str("server_id", server).Str("tool", name).
				Str("from", t.Digest).Strs("change", []string{string(tooldiff.ToolRemoved)}).Msg("definition")
		}
	}
}

// Definitions are the states of the live tools under change control, by
// server and tool: what capsnap holds their changes to (GET /definitions,
// capsnap lock --approved).
func (s *Server) Definitions() (map[string]map[string]store.ToolState, error) {
	r := s.rules.Load()
	out := map[string]map[string]store.ToolState{}
	for id := range s.servers {
		list, _, err := s.catalog.Lookup(id)
		if err != nil || list == nil {
			continue
		}
		var names []string
		for name := range list.Tools {
			if r.Policy.ChangeControl(id, name) != nil {
				names = append(names, name)
			}
		}
		if len(names) == 0 {
			continue
		}
		states, err := s.snapshots.ToolStates(id, names)
		if err != nil {
			return nil, fmt.Errorf("definitions of %s: %w", id, err)
		}
		out[id] = states
	}
	return out, nil
}
