package mcpparse

import "sync"

// A tools/list response is read on every listing, and most of its cost was
// canonicalizing (RFC 8785) every definition in it to digest it, though a
// server sends the same bytes for the same tool listing after listing
// (issue 17: about two thirds of Deliver on a 225-tool list). digestTool is
// a pure function of the definition's bytes: no limit, option or clock
// reaches it, and its validation (the name, the member types, letter-case
// variants) reads nothing else either. So a definition whose bytes were
// digested before has the digest and name it had then, and these are kept
// under those exact bytes: the map compares the whole key, so no two
// definitions share an entry, as no hash of them could promise. Never by
// name: a redefined tool is other bytes, so another key, and is digested
// anew. Only definitions that digested cleanly are kept; a refused one is
// refused again the long way. (The key was the bytes' SHA-256 until that
// hash was 15% of a 225-tool Deliver.)
//
// The callers still check the whole document strictly (checkJSON) before
// they look a definition up: the cache answers only for bytes that passed
// the reader's own checks this time.

// digestCacheGeneration and digestCacheGenerationBytes bound the cache: it
// holds at most two generations, each of at most this many definitions
// and this many bytes of them, enough for the tools of dozens of large
// servers; a definition over an eighth of the bytes is not kept.
const (
	digestCacheGeneration      = 8192
	digestCacheGenerationBytes = 8 << 20
)

// digestCache maps a definition's bytes to what digestTool made of them.
// It is bounded by generations, a cheap approximation of LRU: entries go
// into cur; when cur is full it becomes old and a new cur starts; an entry
// found in old moves back into cur. An entry that is not used for a whole
// generation's insertions is dropped with old.
type digestCache struct {
	mu       sync.Mutex
	cur, old map[string]cachedDigest
	// curBytes is the size of cur's keys.
	curBytes            int
	perGen, perGenBytes int
}

type cachedDigest struct{ digest, name string }

func newDigestCache(perGen, perGenBytes int) *digestCache {
	return &digestCache{cur: make(map[string]cachedDigest), perGen: perGen, perGenBytes: perGenBytes}
}

// deliveredDigests serves every reader of delivered tools in the process
// (ReadDelivery): the response path's and the catalog's own reads of the
// same server's raw lists share it, so the catalog's refresh has usually
// digested what the agent is then delivered.
var deliveredDigests = newDigestCache(digestCacheGeneration, digestCacheGenerationBytes)

func (c *digestCache) get(def []byte) (cachedDigest, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Indexing by string(def) does not copy def.
	if v, ok := c.cur[string(def)]; ok {
		return v, true
	}
	v, ok := c.old[string(def)]
	if ok {
		c.putLocked(string(def), v)
	}
	return v, ok
}

func (c *digestCache) put(def []byte, v cachedDigest) {
	// One definition the size of a generation would start one of its own
	// and push every other out: it is digested each time instead.
	if len(def) > c.perGenBytes/8 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(string(def), v)
}

func (c *digestCache) putLocked(k string, v cachedDigest) {
	if len(c.cur) >= c.perGen || c.curBytes+len(k) > c.perGenBytes {
		c.old, c.cur, c.curBytes = c.cur, make(map[string]cachedDigest, c.perGen), 0
	}
	c.cur[k] = v
	c.curBytes += len(k)
}

// digest is digestTool for a definition in a checked document,
// through the cache: its digest and name.
func (c *digestCache) digest(def []byte) (digest, name string, err error) {
	if v, ok := c.get(def); ok {
		return v.digest, v.name, nil
	}
	digest, name, _, err = digestTool(def)
	if err != nil {
		return "", "", err
	}
	c.put(def, cachedDigest{digest, name})
	return digest, name, nil
}
