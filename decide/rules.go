package decide

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"strings"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/lockfile"
	"github.com/capsnap/capsnap/policy"
)

// Rules are what the operator decides with: the policy and, if it names
// one, its approvals lockfile. They load and reload together.
type Rules struct {
	Policy *policy.Policy
	// Lock is nil when the policy names no lockfile.
	Lock *lockfile.Lock
	// source is the content hash of the files, to tell a real change from
	// a touch.
	source [sha256.Size]byte
}

// LoadRules reads the policy at path and the lockfile it names. Each file
// is read once: what is parsed is what is hashed, so a file replaced
// between the two cannot leave the hash naming other bytes than the rules
// in force (a fleet's accepted loosening is keyed by it).
func LoadRules(path string) (*Rules, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load policy: %w", err)
	}
	p, err := policy.ParseFile(path, data)
	if err != nil {
		return nil, err
	}
	r := &Rules{Policy: p}
	var lock []byte
	if lf := p.Lockfile(); lf != "" {
		if lock, err = os.ReadFile(lf); err != nil {
			return nil, fmt.Errorf("load lockfile: %w", err)
		}
		if r.Lock, err = lockfile.ParseFile(lf, lock); err != nil {
			return nil, err
		}
	}
	r.source = hashSources(data, lock)
	return r, nil
}

// ServedBy refuses rules that classify or grant a tool on a server id
// that is not one of servers, the configured ones: such a rule never
// applies, and is almost always a typo that leaves the server meant
// without it. serve refuses to start on them, and a reload keeps the
// rules in force.
func (r *Rules) ServedBy(servers []string) error {
	none := func(string) ([]string, bool) { return nil, false }
	if found := policy.LintServers(r.Policy, servers, none); len(found) > 0 {
		return fmt.Errorf("policy: %s", strings.Join(found, "; "))
	}
	return nil
}

// sourceHash hashes the policy file and, if there is one, its lockfile,
// as LoadRules does: to tell a real change from a touch without parsing.
func sourceHash(path, lockPath string) ([sha256.Size]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	var lock []byte
	if lockPath != "" {
		if lock, err = os.ReadFile(lockPath); err != nil {
			return [sha256.Size]byte{}, err
		}
	}
	return hashSources(data, lock), nil
}

// hashSources hashes the policy's bytes and the lockfile's, each after its
// length, so that no two pairs of files share a hash by where one ends.
func hashSources(policyBytes, lockBytes []byte) [sha256.Size]byte {
	h := sha256.New()
	for _, b := range [][]byte{policyBytes, lockBytes} {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(b))))
		h.Write(b)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// admit is the one answer to "may p call tool on server, as defined at
// digest, under these rules": the rule that grants it, or why not (the
// policy does not grant it or classifies it not; the lockfile does not
// approve it at digest). Minting, delivery, call verification, a stale
// read and the explanation of a tool a snapshot does not pin all ask it.
// An empty digest is a definition capsnap cannot see (its catalog is
// unavailable): then only the policy is asked.
func (r *Rules) admit(p *policy.Principal, server, tool, digest string) (policy.Decision, *deny.Error) {
	rule, err := p.Decide(server, tool)
	if err != nil {
		if de, ok := deny.As(err); ok {
			return rule, de
		}
		return rule, deny.Errorf(deny.ToolNotGranted, "%v", err)
	}
	if digest != "" && r.Lock != nil && !r.Lock.Approved(server, tool, digest) {
		return rule, deny.Errorf(deny.ToolUnapproved, "the lockfile does not approve %s/%s at %s; it waits for review", server, tool, digest)
	}
	return rule, nil
}
