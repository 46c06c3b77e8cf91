// Putting new rules in force: a reload checked for loosening, on a file
// change, SIGHUP or the admin API.

package decide

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/capsnap/capsnap/policy"
	"github.com/rs/zerolog"
)

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
	if err == nil {
		err = next.ServedBy(slices.Sorted(maps.Keys(s.servers)))
	}
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
	// A file refused once (looser, or invalid) is refused, logged and
	// counted once, not at every poll until it changes again.
	var refused [sha256.Size]byte
	haveRefused := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sum, err := sourceHash(path, s.rules.Load().Policy.Lockfile())
		if err == nil && haveRefused && sum == refused {
			continue
		}
		switch LogReload(log, "file change", path, s) {
		case ReloadLoosening, ReloadInvalid:
			refused, haveRefused = sum, err == nil
		default:
			haveRefused = false
		}
	}
}

// LogReload reloads without loosening, logs the outcome and returns it; it
// is what a file change and SIGHUP both do.
func LogReload(log zerolog.Logger, why, path string, s *Server) string {
	result, err := s.Reload(path, false)
	switch result {
	case ReloadUnchanged:
	case ReloadOK:
		log.Info().Str("trigger", why).Str("policy_digest", s.rules.Load().Policy.Digest()).Msg("policy reloaded")
	default:
		log.Error().Str("trigger", why).Str("result", result).Err(err).Msg("policy reload refused; keeping the policy in force")
	}
	return result
}
