// Package storetest is the contract every store.Backend keeps, as one suite
// of a part each: snapshots (snapshots.go), counters (counters.go),
// approvals (approvals.go), definitions (definitions.go) and the
// acceptances of looser policies (loosenings.go). The memory store of one
// replica and a store several replicas share are held to the same one, so
// a decision never depends on which store it read.
package storetest

import (
	"testing"

	"github.com/capsnap/capsnap/store"
)

// Store is what the contract holds a backend to: the one store port.
type Store = store.Backend

// Open returns a new, empty backend on clock (nil: the real clock) that
// keeps approval requests Retain past their expiry; the test closes it
// through t.Cleanup.
type Open func(t *testing.T, clock *Clock) Store

// Run runs the whole contract against the backends open makes.
func Run(t *testing.T, open Open) {
	t.Run("Snapshots", func(t *testing.T) { runSnapshots(t, open) })
	t.Run("Counters", func(t *testing.T) { runCounters(t, open) })
	t.Run("Approvals", func(t *testing.T) { runApprovals(t, open) })
	t.Run("Definitions", func(t *testing.T) { runDefinitions(t, open) })
	t.Run("Loosenings", func(t *testing.T) { runLoosenings(t, open) })
}
