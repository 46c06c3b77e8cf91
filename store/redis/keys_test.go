package redis_test

import (
	"strings"
	"testing"

	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/redis"
)

// slot is the Redis Cluster slot of key: CRC16 (XMODEM) of its hash tag,
// the bytes between its first '{' and the first '}' after it if there are
// any, or else of the whole key, modulo 16384.
func slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return crc16(key) % 16384
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// The slot function is Redis's: CRC16's check value, and the hash tag
// examples of the cluster specification. (TestClusterKeepsTheStoreContract
// also asks a real cluster.)
func TestSlotIsRedis(t *testing.T) {
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	for key, hashed := range map[string]string{
		"{user1000}.following": "user1000",
		"foo{}{bar}":           "foo{}{bar}",
		"foo{{bar}}zap":        "{bar",
		"foo{bar}{zap}":        "bar",
		"nobraces":             "nobraces",
	} {
		if got, want := slot(key), crc16(hashed)%16384; got != want {
			t.Errorf("slot(%q) = %d, want %d (of %q)", key, got, want, hashed)
		}
	}
}

// Every key one store operation touches in one script, or writes as one
// group, lies in one slot of a Redis Cluster, whatever the principal,
// server, session or epoch hold: braces, an empty name, a tag-closing
// first byte. Keys of different snapshots and principals do not all share
// one.
func TestOneOperationOneSlot(t *testing.T) {
	names := []string{"", "agent", "}", "{", "a}b", "{x}", "}{", "spiffe://acme/ns/default/sa/agent", "ep_" + strings.Repeat("Q", 22)}
	for _, prefix := range []string{"", "capsnap:", "team-a/"} {
		l := redis.Layout{Prefix: prefix}
		groups := map[string][]string{
			// invalidate and restart: one script over both.
			"invalidations": {l.Seq(), l.Invalidations()},
		}
		for _, a := range names {
			// follows: the calls under a snapshot, and the snapshot.
			groups["follows "+a] = []string{l.Calls(a), l.Snapshot(a)}
			for _, b := range names {
				// Put: a session's pointer and the any-session one.
				group := []string{l.AnySession(a, b)}
				for _, sess := range names {
					group = append(group, l.Latest(a, b, sess))
				}
				groups["pointers "+a+" "+b] = group
			}
		}
		for name, keys := range groups {
			for _, k := range keys[1:] {
				if slot(k) != slot(keys[0]) {
					t.Errorf("prefix %q, %s: %q in slot %d, %q in slot %d", prefix, name, keys[0], slot(keys[0]), k, slot(k))
				}
			}
		}
		spread := map[uint16]bool{}
		for range 64 {
			e := store.NewEpoch()
			spread[slot(l.Snapshot(e))] = true
			spread[slot(l.Latest(e, "billing", ""))] = true
			spread[slot(l.Redeemed(e))] = true
		}
		if len(spread) < 100 {
			t.Errorf("prefix %q: 192 keys of 64 epochs, principals and tickets lie in %d slots: the tags do not spread them", prefix, len(spread))
		}
	}
}

// Keys of different things never coincide, whatever their names: the
// tag is length-prefixed and a kind names what a key holds.
func TestKeysAreDistinct(t *testing.T) {
	l := redis.Layout{Prefix: "capsnap:"}
	seen := map[string]string{}
	add := func(what, key string) {
		t.Helper()
		if other, ok := seen[key]; ok && other != what {
			t.Errorf("%s and %s are both %q", other, what, key)
		}
		seen[key] = what
	}
	add("seq", l.Seq())
	add("invalidations", l.Invalidations())
	add("approval index", l.ApprovalIndex())
	names := []string{"", "a", "b", "ab", "1:a", "a}", "}b", "inv"}
	for _, a := range names {
		add("snapshot "+a, l.Snapshot(a))
		add("calls "+a, l.Calls(a))
		add("redeemed "+a, l.Redeemed(a))
		add("counter "+a, l.Counter(a))
		add("loosening "+a, l.Loosening(a))
		add("approval request "+a, l.ApprovalRequest(a))
		add("approval binding "+a, l.ApprovalBinding(a))
		for _, b := range names {
			add("any "+a+"|"+b, l.AnySession(a, b))
			for _, c := range names {
				add("latest "+a+"|"+b+"|"+c, l.Latest(a, b, c))
			}
		}
	}
}
