//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/testbed"
)

// The cross-replica verdicts of TestReplicas hold for agents on every
// official MCP SDK (e2e/sdk_test.go): the Go SDK at its default protocol
// (2026-07-28) and at 2025-11-25, TypeScript's Client and Python's
// ClientSession (2025-11-25), and Python's mcp.Client (2026-07-28). The
// TypeScript and Python clients do not show the epoch header, and a
// session at 2026-07-28 has no Mcp-Session-Id; but each denial's data
// names the epoch it was decided under, as every SDK hands it to its
// caller, and that finds the session's audit lines on both replicas.

// replicasSDKStep is one call of the worked example, and what capsnap
// must decide ("" allowed) whichever replica decides it.
type replicasSDKStep struct {
	name string
	tool string
	args map[string]any
	want string
}

var (
	replicasSDKEarly  = replicasSDKStep{"refund before lookup_order", "refund", sdkRefund40, "sequence_violation"}
	replicasSDKLookup = replicasSDKStep{"lookup_order", "lookup_order", lookupA100, ""}
	replicasSDKRefund = replicasSDKStep{"refund $40", "refund", sdkRefund40, ""}
	replicasSDKOver   = replicasSDKStep{"refund $300", "refund", refundOf(300, "duplicate_charge"), "constraint_violation"}
)

// replicasSDKFlow is the worked example with shift extra calls, each a
// denial that records nothing: early extra refunds before lookup_order
// move the whole flow one Check on (relative to the list), late extra
// refunds over the cap move the allowed refund one Check away from the
// lookup_order it depends on.
func replicasSDKFlow(early, late int) []replicasSDKStep {
	flow := []replicasSDKStep{replicasSDKEarly}
	for range early {
		flow = append(flow, replicasSDKEarly)
	}
	flow = append(flow, replicasSDKLookup)
	for range late {
		flow = append(flow, replicasSDKOver)
	}
	return append(flow, replicasSDKRefund, replicasSDKOver)
}

// replicasSDKAttempt runs the worked example with early and late extra
// calls in a fresh session of kind, which lists once, and checks each
// verdict as the SDK's caller sees it and in the audit line of the replica
// that made it. It returns the flow, the replica that minted the session's
// snapshot and, in order, each call's audit line.
func replicasSDKAttempt(t *testing.T, s *testbed.Stack, kind sdkKind, early, late int) ([]replicasSDKStep, int, []replicaLine) {
	t.Helper()
	flow := replicasSDKFlow(early, late)
	a, connected := sdkConnect(t, kind, s.RouteURL("billing"), supportAgent)
	if !connected.OK {
		t.Fatalf("[%s] connect: %s", kind.name, connected.summary())
	}
	defer func() {
		if st := a.do(t, sdkReq{Op: "close"}); !st.OK {
			t.Errorf("[%s] close: %s", kind.name, st.summary())
		}
	}()
	if got := a.list(t); !slices.Equal(sdkSorted(got), []string{"lookup_order", "refund"}) {
		t.Fatalf("[%s] delivered %v, want lookup_order and refund", kind.name, got)
	}
	before := map[string]int{"lookup_order": starts(t, s, "billing", "lookup_order"), "refund": starts(t, s, "billing", "refund")}
	var epochs []string // that the caller read in its denials' data
	for _, step := range flow {
		if step.want == "" {
			a.mustAllow(t, step.tool, step.args)
		} else {
			epochs = append(epochs, a.mustDeny(t, step.tool, step.args, step.want).Epoch)
		}
	}
	for tool, n := range before {
		if got := starts(t, s, "billing", tool) - n; got != 1 {
			t.Fatalf("[%s] %s's handler ran %d times, want once", kind.name, tool, got)
		}
	}
	// The first call and the last are denials: under one epoch, the
	// session did not list again in between (each list mints anew).
	epoch := epochs[0]
	for _, e := range epochs {
		if e == "" || e != epoch {
			t.Fatalf("[%s] the denials named epochs %q, want the one snapshot the list minted", kind.name, epochs)
		}
	}
	minted, calls := deciders(t, s, epoch, len(flow))
	if len(calls) != len(flow) {
		t.Fatalf("[%s] %d audit lines of calls under %s, for %d calls", kind.name, len(calls), epoch, len(flow))
	}
	for i, l := range calls {
		if step := flow[i]; l.Principal != supportAgent || l.Tool != step.tool || l.Reason != step.want {
			t.Fatalf("[%s] call %d (%s) was audited as %s's %s %q by replica %d, want %q", kind.name, i, step.name, l.Principal, l.Tool, l.Reason, l.Replica, step.want)
		}
	}
	t.Logf("[%s] protocol %s, session %q: listed once, epoch %s", kind.name, connected.ProtocolVersion, connected.SessionID, epoch)
	return flow, minted, calls
}

// replicasSDKCoverage is what one SDK's attempts have shown so far.
type replicasSDKCoverage struct {
	// decided: for each step, the replicas that decided it as it must.
	decided map[string]*[2]bool
	// crossMint: an allowed call was decided by the replica that did not
	// mint its snapshot; crossSequence: the allowed refund was decided by
	// the replica that did not record the lookup_order it needs.
	crossMint, crossSequence bool
}

// add records one attempt, and returns it as a line of the test's log.
func (c *replicasSDKCoverage) add(flow []replicasSDKStep, minted int, calls []replicaLine) string {
	if c.decided == nil {
		c.decided = map[string]*[2]bool{}
	}
	lookup := -1
	row := []string{fmt.Sprintf("minted on %d", minted)}
	for i, l := range calls {
		step := flow[i]
		if c.decided[step.name] == nil {
			c.decided[step.name] = &[2]bool{}
		}
		c.decided[step.name][l.Replica] = true
		c.crossMint = c.crossMint || step.want == "" && l.Replica != minted
		switch step.name {
		case replicasSDKLookup.name:
			lookup = l.Replica
		case replicasSDKRefund.name:
			c.crossSequence = c.crossSequence || l.Replica != lookup
		}
		row = append(row, fmt.Sprintf("%s on %d", step.name, l.Replica))
	}
	return strings.Join(row, ", ")
}

// missing is what the attempts have not shown yet.
func (c *replicasSDKCoverage) missing() []string {
	var out []string
	for _, step := range []replicasSDKStep{replicasSDKEarly, replicasSDKLookup, replicasSDKRefund, replicasSDKOver} {
		for r := range 2 {
			if d := c.decided[step.name]; d == nil || !d[r] {
				out = append(out, fmt.Sprintf("%s decided by replica %d", step.name, r))
			}
		}
	}
	if !c.crossMint {
		out = append(out, "an allowed call decided by the replica that did not mint its snapshot")
	}
	if !c.crossSequence {
		out = append(out, "the allowed refund decided by the replica that did not record its lookup_order")
	}
	return out
}

// Each SDK's agent lists once and runs the worked example against two
// replicas: each call is decided as it must be whichever replica takes its
// Check. An SDK's attempts go on, each a fresh session shifted by extra
// denied calls (consecutive Checks mostly alternate between the replicas,
// and how many Checks a session makes differs by SDK), until, from both
// replicas' audit lines, both replicas have decided every step, an allowed
// call was decided by the replica that did not mint the snapshot, and the
// allowed refund's sequence rule was met by a lookup_order the other
// replica recorded.
func TestReplicasSDKs(t *testing.T) {
	kinds := sdkKinds(t)
	s, _ := replicaStack(t, nil)
	// The (early, late) extra calls of successive attempts.
	shifts := [][2]int{{0, 0}, {1, 0}, {0, 1}, {1, 1}}
	const maxAttempts = 8
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			var cov replicasSDKCoverage
			n := 0
			for ; n < maxAttempts && len(cov.missing()) > 0; n++ {
				shift := shifts[n%len(shifts)]
				flow, minted, calls := replicasSDKAttempt(t, s, kind, shift[0], shift[1])
				t.Logf("[%s] attempt %d, %d early and %d late extra calls: %s", kind.name, n, shift[0], shift[1], cov.add(flow, minted, calls))
			}
			if m := cov.missing(); len(m) > 0 {
				t.Fatalf("[%s] %d attempts did not show %s", kind.name, n, strings.Join(m, "; "))
			}
			t.Logf("[%s] shown in %d attempts", kind.name, n)
		})
	}
}
