// The definitions' part of the contract: what change control keeps of the
// tools' approved and rejected definitions, the same on every backend, so
// that a change approved through one replica is in force on every other.

package storetest

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/capsnap/capsnap/store"
)

// runDefinitions runs the definitions' part against the backends open
// makes.
func runDefinitions(t *testing.T, open Open) {
	tests := []struct {
		name string
		fn   func(*testing.T, Store)
	}{
		{"ApproveIsCompareAndSet", approveIsCompareAndSet},
		{"RejectionsAreKeptNewestFirstAndBounded", rejectionsAreKeptNewestFirstAndBounded},
		{"StatesAreReadPerTool", statesAreReadPerTool},
		{"ConcurrentApprovalsHaveOneWinner", concurrentApprovalsHaveOneWinner},
		{"OpenReviewsAreBounded", openReviewsAreBounded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t, nil)) })
	}
}

// Definition returns an approved definition of tool at digest.
func Definition(tool, digest, by string) store.Definition {
	return store.Definition{
		Digest:     digest,
		Definition: json.RawMessage(fmt.Sprintf(`{"description":"x","inputSchema":{"type":"object"},"name":%q}`, tool)),
		By:         by, At: time.UnixMilli(1_800_000_000_000).UTC(),
	}
}

func stateOf(t *testing.T, s Store, server, tool string) store.ToolState {
	t.Helper()
	states, err := s.ToolStates(server, []string{tool})
	if err != nil {
		t.Fatal(err)
	}
	return states[tool]
}

func approveIsCompareAndSet(t *testing.T, s Store) {
	first, second := Definition("refund", "sha256:01", store.ByFirstSight), Definition("refund", "sha256:02", "alice")
	if ok, err := s.ApproveDefinition("billing", "refund", "", first); err != nil || !ok {
		t.Fatalf("first approval: %v, %v", ok, err)
	}
	if ok, err := s.ApproveDefinition("billing", "refund", "", second); err != nil || ok {
		t.Fatalf("an approval from none once one is approved: %v, %v", ok, err)
	}
	if ok, err := s.ApproveDefinition("billing", "refund", "sha256:01", second); err != nil || !ok {
		t.Fatalf("the change from the approved one: %v, %v", ok, err)
	}
	got := stateOf(t, s, "billing", "refund").Approved
	if got == nil || got.Digest != "sha256:02" || string(got.Definition) != string(second.Definition) || got.By != "alice" || !got.At.Equal(second.At) {
		t.Fatalf("approved %+v, want %+v", got, second)
	}
}

func rejectionsAreKeptNewestFirstAndBounded(t *testing.T, s Store) {
	for i := range store.MaxRejections + 4 {
		r := store.Rejection{Digest: fmt.Sprintf("sha256:%02d", i), By: "alice", Reason: "no", At: time.UnixMilli(int64(i)).UTC()}
		if err := s.RejectDefinition("billing", "refund", r); err != nil {
			t.Fatal(err)
		}
	}
	st := stateOf(t, s, "billing", "refund")
	if len(st.Rejected) != store.MaxRejections || st.Rejected[0].Digest != fmt.Sprintf("sha256:%02d", store.MaxRejections+3) {
		t.Fatalf("%d rejections kept, newest %+v", len(st.Rejected), st.Rejected[0])
	}
	if _, ok := st.Rejection("sha256:00"); ok {
		t.Error("the oldest rejection is kept past the bound")
	}
	newest := fmt.Sprintf("sha256:%02d", store.MaxRejections+3)
	if r, ok := st.Rejection(newest); !ok || r.Reason != "no" || r.By != "alice" {
		t.Errorf("rejection of %s: %+v, %v", newest, r, ok)
	}
	// Approving a rejected definition forgets its rejection.
	if ok, err := s.ApproveDefinition("billing", "refund", "", Definition("refund", newest, "bob")); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, ok := stateOf(t, s, "billing", "refund").Rejection(newest); ok {
		t.Error("an approved definition is still rejected")
	}
}

func statesAreReadPerTool(t *testing.T, s Store) {
	// Names that would run together: server "a/b" tool "c", server "a"
	// tool "b/c".
	for _, k := range [][2]string{{"a/b", "c"}, {"a", "b/c"}, {"a", "x"}} {
		if ok, err := s.ApproveDefinition(k[0], k[1], "", Definition(k[1], "sha256:"+k[0]+k[1], "alice")); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	states, err := s.ToolStates("a", []string{"b/c", "x", "missing"})
	if err != nil {
		t.Fatal(err)
	}
	if len(states) != 2 || states["b/c"].Approved.Digest != "sha256:ab/c" || states["x"].Approved.Digest != "sha256:ax" {
		t.Fatalf("states %+v", states)
	}
	if other := stateOf(t, s, "a/b", "c"); other.Approved == nil || other.Approved.Digest != "sha256:a/bc" {
		t.Fatalf("a/b's c: %+v", other)
	}
	if got, err := s.ToolStates("a", nil); err != nil || len(got) != 0 {
		t.Fatalf("no tools: %v, %v", got, err)
	}
}

func concurrentApprovalsHaveOneWinner(t *testing.T, s Store) {
	const n = 8
	var wg sync.WaitGroup
	wins := make(chan string, n)
	for i := range n {
		wg.Go(func() {
			d := Definition("refund", fmt.Sprintf("sha256:%02d", i), "alice")
			if ok, err := s.ApproveDefinition("race", "refund", "", d); err != nil {
				t.Error(err)
			} else if ok {
				wins <- d.Digest
			}
		})
	}
	wg.Wait()
	close(wins)
	var won []string
	for w := range wins {
		won = append(won, w)
	}
	if len(won) != 1 || stateOf(t, s, "race", "refund").Approved.Digest != won[0] {
		t.Fatalf("winners %v, approved %+v", won, stateOf(t, s, "race", "refund").Approved)
	}
}

func openReviewsAreBounded(t *testing.T, s Store) {
	now := time.UnixMilli(1_800_000_000_000).UTC()
	open := func(digest string, at time.Time) bool {
		t.Helper()
		ok, err := s.OpenReview("billing", "refund", digest, at.Add(time.Hour), at)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for i := range store.MaxReviewing {
		if !open(fmt.Sprintf("sha256:%02d", i), now) {
			t.Fatalf("review %d of %d refused", i+1, store.MaxReviewing)
		}
	}
	if open("sha256:ff", now) {
		t.Fatalf("a review past the bound of %d opened", store.MaxReviewing)
	}
	if !open("sha256:00", now) {
		t.Error("a review already open was refused")
	}
	// Decided, or lapsed, a review makes room.
	if err := s.RejectDefinition("billing", "refund", store.Rejection{Digest: "sha256:01", By: "alice", At: now}); err != nil {
		t.Fatal(err)
	}
	if !open("sha256:ff", now) {
		t.Error("a rejection made no room")
	}
	if !open("sha256:fe", now.Add(time.Hour)) {
		t.Error("lapsed reviews made no room")
	}
	if ok, err := s.ApproveDefinition("billing", "refund", "", Definition("refund", "sha256:fe", "alice")); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if st := stateOf(t, s, "billing", "refund"); len(st.Reviewing) != 0 {
		t.Errorf("an approval left %d reviews open", len(st.Reviewing))
	}
}
