package store

import (
	"encoding/json"
	"slices"
	"sync"
	"time"
)

// Definition is the approved definition of one tool: the only digest a
// snapshot may pin it at, while its server is under change control.
type Definition struct {
	Digest string `json:"digest"`
	// Definition is the canonical governing definition Digest covers
	// (catalog.Tool.Definition): what the next change is compared with.
	Definition json.RawMessage `json:"definition"`
	// By says who approved it: ByFirstSight, ByLockfile, "policy:" and
	// the rule that accepted the change, or a reviewer's identity.
	By string    `json:"by"`
	At time.Time `json:"at"`
}

// Who approves a definition, but for the policy's rules and reviewers.
const (
	ByFirstSight = "first_sight"
	ByLockfile   = "lockfile"
)

// Rejection is a definition a reviewer rejected: its tool stays out of
// every snapshot while its server lists it.
type Rejection struct {
	Digest string    `json:"digest"`
	By     string    `json:"by"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
}

// ToolState is what the store holds of one tool's definitions.
type ToolState struct {
	// Approved is nil until a definition is approved.
	Approved *Definition `json:"approved,omitempty"`
	// Rejected are the rejected definitions, newest first, at most
	// MaxRejections.
	Rejected []Rejection `json:"rejected,omitempty"`
	// Reviewing are the definitions a review is open for, newest first:
	// a server that keeps changing a tool opens at most MaxReviewing.
	Reviewing []Reviewing `json:"reviewing,omitempty"`
}

// Reviewing is a definition whose review is open until Until.
type Reviewing struct {
	Digest string    `json:"digest"`
	Until  time.Time `json:"until"`
}

// MaxReviewing bounds the reviews open at once for one tool.
const MaxReviewing = 8

// MaxRejections bounds the rejections kept per tool: a server flapping
// between definitions cannot grow a record without bound.
const MaxRejections = 16

// Rejection returns the rejection of digest, if it is one.
func (s ToolState) Rejection(digest string) (Rejection, bool) {
	i := slices.IndexFunc(s.Rejected, func(r Rejection) bool { return r.Digest == digest })
	if i < 0 {
		return Rejection{}, false
	}
	return s.Rejected[i], true
}

// Reviews reports whether a review of digest is open at now.
func (s ToolState) Reviews(digest string, now time.Time) bool {
	return slices.ContainsFunc(s.Reviewing, func(r Reviewing) bool { return r.Digest == digest && now.Before(r.Until) })
}

// Open is s with a review of digest open until until, if fewer than
// MaxReviewing are open at now (or one is open for digest already); ok
// is false when the bound stops it. Lapsed reviews are forgotten.
func (s ToolState) Open(digest string, until, now time.Time) (ToolState, bool) {
	if s.Reviews(digest, now) {
		return s, true
	}
	open := slices.DeleteFunc(slices.Clone(s.Reviewing), func(r Reviewing) bool { return !now.Before(r.Until) || r.Digest == digest })
	if len(open) >= MaxReviewing {
		return s, false
	}
	s.Reviewing = append([]Reviewing{{Digest: digest, Until: until}}, open...)
	return s, true
}

// Approve is s with d approved, if its approved digest is still prev ("" for
// none); a rejection of d's digest is forgotten. Every backend keeps the
// state by this one rule.
func (s ToolState) Approve(prev string, d Definition) (ToolState, bool) {
	cur := ""
	if s.Approved != nil {
		cur = s.Approved.Digest
	}
	if cur != prev {
		return s, false
	}
	s.Approved = &d
	s.Rejected = slices.DeleteFunc(slices.Clone(s.Rejected), func(r Rejection) bool { return r.Digest == d.Digest })
	// Every open review compares with the definition approved before.
	s.Reviewing = nil
	return s, true
}

// Reject is s with r recorded, newest first, at most MaxRejections.
func (s ToolState) Reject(r Rejection) ToolState {
	rest := slices.DeleteFunc(slices.Clone(s.Rejected), func(x Rejection) bool { return x.Digest == r.Digest })
	s.Rejected = append([]Rejection{r}, rest...)
	s.Reviewing = slices.DeleteFunc(slices.Clone(s.Reviewing), func(x Reviewing) bool { return x.Digest == r.Digest })
	if len(s.Rejected) > MaxRejections {
		s.Rejected = s.Rejected[:MaxRejections]
	}
	return s
}

// Definitions are the approved definitions of the tools under change
// control, fleet-wide: what a change is compared with, and what a
// snapshot may pin.
type Definitions interface {
	// ToolStates are the states of server's tools, by name, in one read;
	// a tool the store holds nothing of is absent.
	ToolStates(server string, tools []string) (map[string]ToolState, error)
	// ApproveDefinition makes d the approved definition of server/tool if
	// the approved digest is still prev ("" for none), and forgets a
	// rejection of d's digest: of two replicas approving at once, one
	// wins, and ok is false for the other.
	ApproveDefinition(server, tool, prev string, d Definition) (ok bool, err error)
	// RejectDefinition records r for server/tool.
	RejectDefinition(server, tool string, r Rejection) error
	// OpenReview notes a review of server/tool at digest open until until,
	// unless MaxReviewing are open at now: ok is false then, and none
	// may open.
	OpenReview(server, tool, digest string, until, now time.Time) (ok bool, err error)
}

// definitions are the memory store's.
type definitions struct {
	mu    sync.Mutex
	tools map[[2]string]ToolState
}

// ToolStates implements Definitions.
func (m *Memory) ToolStates(server string, tools []string) (map[string]ToolState, error) {
	m.defs.mu.Lock()
	defer m.defs.mu.Unlock()
	out := map[string]ToolState{}
	for _, t := range tools {
		if s, ok := m.defs.tools[[2]string{server, t}]; ok {
			out[t] = s
		}
	}
	return out, nil
}

// ApproveDefinition implements Definitions.
func (m *Memory) ApproveDefinition(server, tool, prev string, d Definition) (bool, error) {
	m.defs.mu.Lock()
	defer m.defs.mu.Unlock()
	k := [2]string{server, tool}
	next, ok := m.defs.tools[k].Approve(prev, d)
	if ok {
		m.defs.set(k, next)
	}
	return ok, nil
}

// RejectDefinition implements Definitions.
func (m *Memory) RejectDefinition(server, tool string, r Rejection) error {
	m.defs.mu.Lock()
	defer m.defs.mu.Unlock()
	k := [2]string{server, tool}
	m.defs.set(k, m.defs.tools[k].Reject(r))
	return nil
}

// OpenReview implements Definitions.
func (m *Memory) OpenReview(server, tool, digest string, until, now time.Time) (bool, error) {
	m.defs.mu.Lock()
	defer m.defs.mu.Unlock()
	k := [2]string{server, tool}
	next, ok := m.defs.tools[k].Open(digest, until, now)
	if ok {
		m.defs.set(k, next)
	}
	return ok, nil
}

func (d *definitions) set(k [2]string, s ToolState) {
	if d.tools == nil {
		d.tools = map[[2]string]ToolState{}
	}
	d.tools[k] = s
}
