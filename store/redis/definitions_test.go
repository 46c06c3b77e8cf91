package redis_test

import (
	"strings"
	"testing"

	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/redis"
	"github.com/capsnap/capsnap/store/storetest"
	"github.com/capsnap/capsnap/testbed"
)

// Write access to Redis alone approves no definition: a record edited, or
// moved to another tool's key, fails its MAC, is read as none and audited.
func TestForgedDefinitionsAreRejected(t *testing.T) {
	r := testbed.StartRedis(t)
	a, prefix := open(t, r, "")
	l := redis.Layout{Prefix: prefix}
	if ok, err := a.ApproveDefinition("billing", "refund", "", storetest.Definition("refund", "sha256:01", store.ByFirstSight)); err != nil || !ok {
		t.Fatal(ok, err)
	}
	raw, err := r.Do("GET", l.Definition("billing", "refund"))
	if err != nil {
		t.Fatal(err)
	}
	forged := strings.Replace(raw, "sha256:01", "sha256:ff", 1)
	if forged == raw {
		t.Fatalf("no digest in the record %q", raw)
	}
	mustDo(t, r, "SET", l.Definition("billing", "refund"), forged)
	mustDo(t, r, "SET", l.Definition("billing", "lookup_order"), raw)
	states, err := a.ToolStates("billing", []string{"refund", "lookup_order"})
	if err != nil || len(states) != 0 {
		t.Fatalf("forged definitions were read: %+v, %v", states, err)
	}
	if n := strings.Count(a.audit.String(), `"event":"store_record_rejected"`); n != 2 {
		t.Errorf("%d rejections audited, want 2:\n%s", n, a.audit)
	}
	// A forged record is none: the next approval from none replaces it.
	if ok, err := a.ApproveDefinition("billing", "refund", "", storetest.Definition("refund", "sha256:02", "alice")); err != nil || !ok {
		t.Fatalf("approval over a forged record: %v, %v", ok, err)
	}
}
