package decide

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"

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

// Reload results, the values of capsnap_policy_reloads_total{result}.
const (
	ReloadOK        = "ok"
	ReloadUnchanged = "unchanged"
	ReloadInvalid   = "invalid"
	ReloadLoosening = "refused_loosening"
)

// ErrLoosening is returned by Reload for a policy looser than the one in
// force when loosening was not explicitly allowed.
var ErrLoosening = errors.New("the new policy is looser than the one in force")

// Reload loads the rules at path and puts them in force for every decision
// that starts after it returns. An invalid policy or lockfile keeps the
// rules in force: a reload never fails open. A policy that loosens anything
// (a new grant, a higher ceiling, a removed or changed constraint, a newly
// approved tool) is refused unless allowLoosening; even then only snapshots
// minted afterwards get it, as existing ones pin the old rules' digests.
func (s *Server) Reload(path string, allowLoosening bool) (result string, err error) {
	defer func() { s.metrics.reloaded(result) }()
	cur := s.rules.Load()
	// The poller calls this every few seconds: compile only what changed.
	// While the policy's bytes are the same, so is the lockfile it names.
	if sum, err := sourceHash(path, cur.Policy.Lockfile()); err == nil && sum == cur.source {
		return ReloadUnchanged, nil
	}
	next, err := LoadRules(path)
	if err != nil {
		return ReloadInvalid, err
	}
	if next.source == cur.source {
		return ReloadUnchanged, nil
	}
	if loose := loosenings(cur, next); len(loose) > 0 && !allowLoosening {
		return ReloadLoosening, fmt.Errorf("%w: %s", ErrLoosening, strings.Join(loose, "; "))
	}
	s.SetRules(next)
	return ReloadOK, nil
}

// loosenings lists every way next is looser than cur, the lockfile's newly
// approved tools included.
func loosenings(cur, next *Rules) []string {
	out := policy.Loosenings(cur.Policy, next.Policy)
	if next.Lock == nil {
		return out
	}
	for _, e := range next.Lock.Entries() {
		if cur.Lock != nil && !cur.Lock.Approved(e.ServerID, e.Tool, e.Digest) {
			out = append(out, fmt.Sprintf("lockfile approves %s/%s at %s", e.ServerID, e.Tool, e.Digest))
		}
	}
	return out
}

// WatchPolicy reloads the rules at path whenever its content (or the
// lockfile's) changes, polling every interval until ctx ends. Polling
// content, not file events, survives editors that replace files and
// Kubernetes ConfigMap symlink swaps alike. Watched reloads never loosen.
func (s *Server) WatchPolicy(ctx context.Context, path string, interval time.Duration, log zerolog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		LogReload(log, "file change", path, s)
	}
}

// LogReload reloads without loosening and logs the outcome; it is what a
// file change and SIGHUP both do.
func LogReload(log zerolog.Logger, why, path string, s *Server) {
	result, err := s.Reload(path, false)
	switch result {
	case ReloadUnchanged:
	case ReloadOK:
		log.Info().Str("trigger", why).Str("policy_digest", s.rules.Load().Policy.Digest()).Msg("policy reloaded")
	default:
		log.Error().Str("trigger", why).Str("result", result).Err(err).Msg("policy reload refused; keeping the policy in force")
	}
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
