package decide

import (
	"crypto/sha256"
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

// LoadRules reads the policy at path and the lockfile it names.
func LoadRules(path string) (*Rules, error) {
	p, err := policy.Load(path)
	if err != nil {
		return nil, err
	}
	r := &Rules{Policy: p}
	if r.source, err = sourceHash(path, p.Lockfile()); err != nil {
		return nil, fmt.Errorf("load rules: %w", err)
	}
	if lf := p.Lockfile(); lf != "" {
		if r.Lock, err = lockfile.Load(lf); err != nil {
			return nil, err
		}
	}
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

// sourceHash hashes the policy file and, if there is one, its lockfile.
func sourceHash(path, lockPath string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	h := sha256.New()
	for _, f := range []string{path, lockPath} {
		if f == "" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return sum, err
		}
		h.Write(data)
	}
	h.Sum(sum[:0])
	return sum, nil
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
