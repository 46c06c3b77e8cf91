package redis_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/redis"
	"github.com/capsnap/capsnap/testbed"
)

// A ticket one replica redeemed is redeemed for another, until its record
// expires; one no replica redeemed is not; a record written without the
// secret is read as absent and audited; a Redis that cannot answer says
// so rather than "not redeemed".
func TestRedemptionsAreShared(t *testing.T) {
	r := testbed.StartRedis(t)
	a, prefix := open(t, r, "")
	b, _ := open(t, r, prefix)

	if err := a.Redeem([]string{"ticket-one", "ticket-two"}, time.Second); err != nil {
		t.Fatal(err)
	}
	got, err := b.Redeemed([]string{"ticket-one", "ticket-never", "ticket-two"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, true}; !slices.Equal(got, want) {
		t.Fatalf("redeemed %v, want %v", got, want)
	}
	if got, err := b.Redeemed(nil); err != nil || len(got) != 0 {
		t.Fatalf("nothing asked: %v, %v", got, err)
	}

	// Written without the secret, or moved from another ticket's key.
	mustDo(t, r, "SET", redis.Layout{Prefix: prefix}.Redeemed("ticket-forged"), "forged")
	mac, err := r.Do("GET", redis.Layout{Prefix: prefix}.Redeemed("ticket-one"))
	if err != nil {
		t.Fatal(err)
	}
	mustDo(t, r, "SET", redis.Layout{Prefix: prefix}.Redeemed("ticket-moved"), mac)
	if got, err := b.Redeemed([]string{"ticket-forged", "ticket-moved"}); err != nil || slices.Contains(got, true) {
		t.Fatalf("forged redemptions read as %v, %v", got, err)
	}
	if n := value(t, b.reg, "capsnap_store_records_rejected_total", "redemption"); n != 2 {
		t.Errorf("records_rejected_total{kind=redemption} = %v, want 2", n)
	}
	if !strings.Contains(b.audit.String(), `"kind":"redemption"`) {
		t.Errorf("no audit line for the forged redemption:\n%s", b.audit.String())
	}

	waitFor(t, "the redemption to expire", func() bool {
		got, err := b.Redeemed([]string{"ticket-one"})
		return err == nil && !got[0]
	})

	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the store to be unavailable", func() bool {
		_, err := b.Redeemed([]string{"ticket-two"})
		return errors.Is(err, store.ErrUnavailable)
	})
	if err := a.Redeem([]string{"ticket-three"}, time.Second); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Redeem with Redis gone: %v", err)
	}
}
