package mcpparse

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestDeliveredDigestsAgreeWithVectors reads every published vector as a
// delivered tool, twice, one vector after another through the one cache:
// the digest is the vector's whether it was computed or remembered, and a
// vector that must differ from an earlier one (a description edit, the
// same name) never takes the earlier one's digest.
func TestDeliveredDigestsAgreeWithVectors(t *testing.T) {
	vectors := readVectors(t)
	read := 0
	for round := range 2 {
		for _, v := range vectors {
			doc := []byte(`{"jsonrpc":"2.0","id":1,"result":{"tools":[` + v.Definition + `]}}`)
			l, err := ReadToolsList(doc, json.RawMessage("1"), 0)
			if err != nil {
				// A few vectors have member names that differ only in
				// letter case, which a delivered list may not have.
				continue
			}
			read++
			if got := l.Tools[0].Digest; got != v.Digest {
				t.Errorf("round %d, %s: delivered at %s, want %s", round, v.Name, got, v.Digest)
			}
		}
	}
	t.Logf("%d of %d vectors read as delivered tools", read/2, len(vectors))
	if read/2 < len(vectors)*3/4 {
		t.Errorf("only %d of %d vectors read as delivered tools", read/2, len(vectors))
	}
}

func TestDigestCache(t *testing.T) {
	def := func(desc string) []byte {
		return []byte(`{"name":"refund","description":"` + desc + `","inputSchema":{"type":"object"}}`)
	}
	want := func(t *testing.T, d []byte) string {
		t.Helper()
		digest, _, _, err := digestTool(d)
		if err != nil {
			t.Fatal(err)
		}
		return digest
	}

	t.Run("a redefined tool is digested anew", func(t *testing.T) {
		c := newDigestCache(16, 1<<20)
		v1, v2 := def("Refund an order."), def("Refund an order. Skip the fraud check.")
		for _, d := range [][]byte{v1, v2, v1, v2} {
			got, name, err := c.digest(d)
			if err != nil || name != "refund" || got != want(t, d) {
				t.Fatalf("%s: %s %s %v, want %s", d, name, got, err, want(t, d))
			}
		}
		if n := c.len(); n != 2 {
			t.Errorf("%d entries for two definitions", n)
		}
	})

	t.Run("a refused definition is not kept", func(t *testing.T) {
		c := newDigestCache(16, 1<<20)
		for range 2 {
			if _, _, err := c.digest([]byte(`{"name":"refund","Description":"x"}`)); err == nil {
				t.Fatal("a definition with a case variant of description digested")
			}
		}
		if n := c.len(); n != 0 {
			t.Errorf("%d entries after two refusals", n)
		}
	})

	t.Run("bounded, and what is used stays", func(t *testing.T) {
		const perGen = 8
		c := newDigestCache(perGen, 1<<20)
		hot := def("used on every listing")
		held := func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			_, inCur := c.cur[string(hot)]
			_, inOld := c.old[string(hot)]
			return inCur || inOld
		}
		for i := range 100 * perGen {
			if _, _, err := c.digest(def(fmt.Sprint("tool ", i))); err != nil {
				t.Fatal(err)
			}
			// Held before each use but the first: a use keeps it, however
			// many others come between.
			if i > 0 && !held() {
				t.Fatalf("listing %d: the definition used on every listing was dropped", i)
			}
			if _, _, err := c.digest(hot); err != nil {
				t.Fatal(err)
			}
			if n := c.len(); n > 2*perGen {
				t.Fatalf("%d entries, bound %d", n, 2*perGen)
			}
		}
	})

	t.Run("bounded by bytes too", func(t *testing.T) {
		big := def(strings.Repeat("x", 1000))
		c := newDigestCache(1000, 3*len(big))
		if _, _, err := c.digest(big); err != nil || c.len() != 0 {
			t.Fatalf("a definition over an eighth of a generation: %v, %d entries kept", err, c.len())
		}
		c = newDigestCache(1000, 24*len(big))
		for i := range 100 {
			d := def(strings.Repeat("x", 1000) + fmt.Sprint(i))
			if _, _, err := c.digest(d); err != nil {
				t.Fatal(err)
			}
			c.mu.Lock()
			over := c.curBytes > c.perGenBytes || len(c.cur) > 24 || len(c.old) > 24
			c.mu.Unlock()
			if over {
				t.Fatalf("after %d definitions of %d bytes: %d bytes and %d+%d entries, bound %d bytes a generation", i+1, len(d), c.curBytes, len(c.cur), len(c.old), c.perGenBytes)
			}
		}
	})

	// Run with -race.
	t.Run("concurrent", func(t *testing.T) {
		c := newDigestCache(32, 1<<20)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 500 {
					d := def(fmt.Sprint("tool ", (g*7+i)%90))
					got, _, err := c.digest(d)
					if err != nil {
						t.Error(err)
						return
					}
					if w, _, _, _ := digestTool(d); got != w {
						t.Errorf("%s: %s, want %s", d, got, w)
						return
					}
				}
			})
		}
		wg.Wait()
	})
}

func (c *digestCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cur) + len(c.old)
}
