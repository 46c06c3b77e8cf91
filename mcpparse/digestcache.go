package mcpparse

import (
	"crypto/sha256"
	"sync"
)

// A tools/list response is read on every listing, and most of its cost was
// canonicalizing (RFC 8785) every definition in it to digest it, though a
// server sends the same bytes for the same tool listing after listing
// (issue 17: about two thirds of Deliver on a 225-tool list). digestTool is
// a pure function of the definition's bytes: no limit, option or clock
// reaches it, and its validation (the name, the member types, letter-case
// variants) reads nothing else either. So a definition whose bytes were
// digested before has the digest and name it had then, and these are kept
// by the SHA-256 of those exact bytes. Never by name: a redefined tool is
// other bytes, so another key, and is digested anew. SHA-256 and not a
// faster hash, because a collision here would hand one definition another's
// digest, which is exactly what the digest exists to rule out. Only
// definitions that digested cleanly are kept; a refused one is refused
// again the long way.
//
// The callers still check the whole document strictly (checkJSON) before
// they look a definition up: the cache answers only for bytes that passed
// the reader's own checks this time.

// digestCacheGeneration bounds the cache: it holds at most two generations
// of this many definitions (a few hundred bytes each, whatever the size of
// the definition), enough for the tools of dozens of large servers.
const digestCacheGeneration = 8192

// digestCache maps the SHA-256 of a definition's bytes to what digestTool
// made of them. It is bounded by generations, a cheap approximation of LRU:
// entries go into cur; when cur is full it becomes old and a new cur
// starts; an entry found in old moves back into cur. An entry that is not
// used for a whole generation's insertions is dropped with old.
type digestCache struct {
	mu       sync.Mutex
	cur, old map[[sha256.Size]byte]cachedDigest
	perGen   int
}

type cachedDigest struct{ digest, name string }

func newDigestCache(perGen int) *digestCache {
	return &digestCache{cur: make(map[[sha256.Size]byte]cachedDigest), perGen: perGen}
}

// deliveredDigests serves every reader of delivered tools in the process
// (ReadDelivery): the response path's and the catalog's own reads of the
// same server's raw lists share it, so the catalog's refresh has usually
// digested what the agent is then delivered.
var deliveredDigests = newDigestCache(digestCacheGeneration)

func (c *digestCache) get(k [sha256.Size]byte) (cachedDigest, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.cur[k]; ok {
		return v, true
	}
	v, ok := c.old[k]
	if ok {
		c.putLocked(k, v)
	}
	return v, ok
}

func (c *digestCache) put(k [sha256.Size]byte, v cachedDigest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(k, v)
}

func (c *digestCache) putLocked(k [sha256.Size]byte, v cachedDigest) {
	if len(c.cur) >= c.perGen {
		c.old, c.cur = c.cur, make(map[[sha256.Size]byte]cachedDigest, c.perGen)
	}
	c.cur[k] = v
}

// digest is digestTool for a definition in a checked document,
// through the cache: its digest and name.
func (c *digestCache) digest(def []byte) (digest, name string, err error) {
	k := sha256.Sum256(def)
	if v, ok := c.get(k); ok {
		return v.digest, v.name, nil
	}
	digest, name, _, err = digestTool(def)
	if err != nil {
		return "", "", err
	}
	c.put(k, cachedDigest{digest, name})
	return digest, name, nil
}
