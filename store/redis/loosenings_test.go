package redis_test

import (
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/store/redis"
	"github.com/capsnap/capsnap/store/storetest"
	"github.com/capsnap/capsnap/testbed"
)

// Write access to Redis alone accepts no looser policy for the replicas:
// an acceptance edited (who, or why), or moved to other files' key, fails
// its MAC, is read as none and audited; another replica reads a true one.
func TestForgedAcceptancesAreRejected(t *testing.T) {
	r := testbed.StartRedis(t)
	a, prefix := open(t, r, "")
	b, _ := open(t, r, prefix)
	l := redis.Layout{Prefix: prefix}
	accepted := storetest.Acceptance("sha256:0a", time.Now(), time.Hour)
	if err := a.AcceptLoosening(accepted); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := b.AcceptedLoosening("sha256:0a"); err != nil || !ok || got.By != accepted.By {
		t.Fatalf("the other replica reads %+v, %v, %v", got, ok, err)
	}
	raw, err := r.Do("GET", l.Loosening("sha256:0a"))
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(raw, "alice@acme.example", "mallory@acme.example", 1)
	if edited == raw {
		t.Fatalf("no one in the record %q", raw)
	}
	mustDo(t, r, "SET", l.Loosening("sha256:0a"), edited)
	mustDo(t, r, "SET", l.Loosening("sha256:0b"), raw)
	for _, source := range []string{"sha256:0a", "sha256:0b"} {
		if got, ok, err := b.AcceptedLoosening(source); err != nil || ok {
			t.Fatalf("a forged acceptance of %s was read: %+v, %v", source, got, err)
		}
	}
	if n := strings.Count(b.audit.String(), `"event":"store_record_rejected"`); n != 2 {
		t.Errorf("%d rejections audited, want 2:\n%s", n, b.audit)
	}
}
