package redis

import (
	"testing"

	"github.com/capsnap/capsnap/store"
)

// A pointer's key, made in one allocation, is the key its tag names.
func TestPointerKey(t *testing.T) {
	names := []string{"", "a", "}", "{x}", "spiffe://acme/agent/support-refund", "ünïcode"}
	for _, prefix := range []string{"", "capsnap:"} {
		l := Layout{Prefix: prefix}
		for _, a := range names {
			for _, b := range names {
				for _, s := range names {
					if got, want := l.Latest(a, b, s), l.key("latest", store.AnySessionKey(a, b), s); got != want {
						t.Fatalf("Latest(%q, %q, %q) = %q, want %q", a, b, s, got, want)
					}
				}
				if got, want := l.AnySession(a, b), l.key("any", store.AnySessionKey(a, b), ""); got != want {
					t.Fatalf("AnySession(%q, %q) = %q, want %q", a, b, got, want)
				}
			}
		}
	}
	l := Layout{Prefix: "capsnap:"}
	if n := testing.AllocsPerRun(100, func() { l.Latest("spiffe://acme/agent/support-refund", "billing", "S-1") }); n != 1 {
		t.Errorf("Latest allocates %v times, want 1", n)
	}
}
