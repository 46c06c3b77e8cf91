// Putting new rules in force: a reload checked for loosening, on a file
// change, SIGHUP or the admin API; and a loosening a person accepted on one
// replica, put in force on every replica that shares the store.

package decide

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
	"github.com/rs/zerolog"
)

// Reload results, the values of capsnap_policy_reloads_total{result}.
const (
	ReloadOK        = "ok"
	ReloadUnchanged = "unchanged"
	ReloadInvalid   = "invalid"
	ReloadLoosening = "refused_loosening"
	// ReloadUnrecorded is a loosening a person accepted that the store
	// could not record for the other replicas: no replica puts it in
	// force, this one included.
	ReloadUnrecorded = "unrecorded"
)

// ErrLoosening is returned by Reload for a policy looser than the one in
// force that no one accepted.
var ErrLoosening = errors.New("the new policy is looser than the one in force")

// Signoff is a person's explicit say-so for a change to what capsnap
// enforces (a looser policy put in force, a budget reset): who, and why,
// as the admin request states them. The admin token authenticates the
// request; By is what its sender says of themselves, for the audit trail.
type Signoff struct{ By, Reason string }

// The bounds of a signoff's words: a name or an address, and a sentence or
// two.
const (
	maxSignoffBy     = 256
	maxSignoffReason = 1024
)

// Check reports whether o says who and why, in printable UTF-8 of bounded
// length: what goes into every replica's audit trail.
func (o Signoff) Check() error {
	for _, f := range []struct {
		name, value string
		max         int
	}{{"by", o.By, maxSignoffBy}, {"reason", o.Reason, maxSignoffReason}} {
		switch {
		case strings.TrimSpace(f.value) == "":
			return fmt.Errorf("%s is required: the audit trail says who asked, and why", f.name)
		case len(f.value) > f.max:
			return fmt.Errorf("%s is longer than %d bytes", f.name, f.max)
		case !utf8.ValidString(f.value) || strings.ContainsFunc(f.value, unicode.IsControl):
			return fmt.Errorf("%s holds a control character or is not UTF-8", f.name)
		}
	}
	return nil
}

// Reload loads the rules at path and puts them in force for every decision
// that starts after it returns. An invalid policy or lockfile keeps the
// rules in force: a reload never fails open. A policy that loosens anything
// (a new grant, a higher ceiling, a removed or changed constraint, a newly
// approved tool) is put in force only if a person accepts exactly these
// files: here, with accept, which is recorded in the store for every
// replica that shares it (for store.MaxAcceptance); or on any replica
// before, as the store says. Even then only snapshots minted afterwards
// get it, as existing ones pin the old rules' digests.
func (s *Server) Reload(path string, accept *Signoff) (result string, err error) {
	result, _, err = s.reload(path, accept)
	return result, err
}

// reload is Reload; source names the files it read, if it read them.
func (s *Server) reload(path string, accept *Signoff) (result, source string, err error) {
	defer func() { s.metrics.reloaded(result) }()
	cur := s.rules.Load()
	// The poller calls this every few seconds: compile only what changed.
	// While the policy's bytes are the same, so is the lockfile it names.
	if sum, err := sourceHash(path, cur.Policy.Lockfile()); err == nil && sum == cur.source {
		return ReloadUnchanged, "", nil
	}
	next, err := LoadRules(path)
	if err == nil {
		err = next.ServedBy(slices.Sorted(maps.Keys(s.servers)))
	}
	if err == nil {
		err = s.readsLiveArguments(next)
	}
	if err != nil {
		return ReloadInvalid, "", err
	}
	if next.source == cur.source {
		return ReloadUnchanged, "", nil
	}
	source = sourceName(next.source)
	loose := loosenings(cur, next)
	if len(loose) == 0 {
		s.SetRules(next)
		return ReloadOK, source, nil
	}
	refused := fmt.Errorf("%w: %s", ErrLoosening, strings.Join(loose, "; "))
	var a store.Acceptance
	if accept != nil {
		if err := accept.Check(); err != nil {
			return ReloadLoosening, source, fmt.Errorf("%w; %w", refused, err)
		}
		now := s.now()
		a = store.Acceptance{
			Source: source, PolicyDigest: next.Policy.Digest(), By: accept.By, Reason: accept.Reason,
			At: now, Until: now.Add(store.MaxAcceptance),
		}
		if err := s.snapshots.AcceptLoosening(a); err != nil {
			return ReloadUnrecorded, source, fmt.Errorf("record the acceptance for every replica: %w", err)
		}
	} else {
		var ok bool
		switch a, ok, err = s.snapshots.AcceptedLoosening(source); {
		case err != nil:
			return ReloadLoosening, source, fmt.Errorf("%w; whether a replica accepted it cannot be read: %w", refused, err)
		case !ok:
			return ReloadLoosening, source, refused
		}
	}
	s.SetRules(next)
	s.auditLoosened(cur, next, a, loose, accept != nil)
	return ReloadOK, source, nil
}

// sourceName is how a source hash is named to people and in the store.
func sourceName(sum [sha256.Size]byte) string { return "sha256:" + hex.EncodeToString(sum[:]) }

// auditLoosened writes the audit line of a looser policy put in force on
// a's acceptance: asked of this replica (requested), or found in the
// store.
func (s *Server) auditLoosened(cur, next *Rules, a store.Acceptance, loose []string, requested bool) {
	via := "store"
	if requested {
		via = "request"
	}
	s.auditLog.Log().Str("event", "policy_loosened").
		Str("policy_digest", next.Policy.Digest()).Str("previous_policy_digest", cur.Policy.Digest()).Str("source", a.Source).
		Str("by", a.By).Str("reason", a.Reason).Time("accepted_at", a.At.UTC()).Time("accepted_until", a.Until.UTC()).Str("accepted_via", via).
		Strs("loosenings", loose).Msg("policy")
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
// Kubernetes ConfigMap symlink swaps alike. Watched reloads loosen only
// on an acceptance a replica recorded in the store.
func (s *Server) WatchPolicy(ctx context.Context, path string, interval time.Duration, log zerolog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	// A file refused once (looser, or invalid) is refused, logged and
	// counted once, not at every poll until it changes again. A looser
	// one is looked for in the store at every poll instead, and put in
	// force once a replica records a person's acceptance of it.
	var refused [sha256.Size]byte
	haveRefused, looser := false, ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sum, err := sourceHash(path, s.rules.Load().Policy.Lockfile())
		why := "file change"
		if err == nil && haveRefused && sum == refused {
			if !s.accepted(looser) {
				continue
			}
			why = "accepted on another replica"
		}
		switch result, source := logReload(log, why, path, s); result {
		case ReloadLoosening:
			refused, haveRefused, looser = sum, err == nil, source
		case ReloadInvalid:
			refused, haveRefused, looser = sum, err == nil, ""
		default:
			haveRefused = false
		}
	}
}

// accepted reports whether the store holds an acceptance of the files
// source names. A store that cannot say holds none: the files stay
// refused until it can.
func (s *Server) accepted(source string) bool {
	if source == "" {
		return false
	}
	_, ok, err := s.snapshots.AcceptedLoosening(source)
	return ok && err == nil
}

// LogReload reloads without an acceptance of its own, logs the outcome and
// returns it; it is what a file change and SIGHUP both do.
func LogReload(log zerolog.Logger, why, path string, s *Server) string {
	result, _ := logReload(log, why, path, s)
	return result
}

// logReload is LogReload, and the source of the files it read.
func logReload(log zerolog.Logger, why, path string, s *Server) (result, source string) {
	result, source, err := s.reload(path, nil)
	switch result {
	case ReloadUnchanged:
	case ReloadOK:
		log.Info().Str("trigger", why).Str("policy_digest", s.rules.Load().Policy.Digest()).Msg("policy reloaded")
	default:
		log.Error().Str("trigger", why).Str("result", result).Err(err).Msg("policy reload refused; keeping the policy in force")
	}
	return result, source
}

// readsLiveArguments refuses rules with an expression that reads an
// argument the live definition of a tool it applies to does not declare
// (policy.LintArguments: args.ammount for amount), which would deny every
// call to it: the rules in force stay, as capsnap check --connect would
// have said. A tool whose catalog capsnap cannot see now is not held to
// it.
func (s *Server) readsLiveArguments(r *Rules) error {
	schemas := func(server, tool string) (json.RawMessage, bool) {
		list, _, err := s.catalog.Lookup(server)
		if err != nil || list == nil {
			return nil, false
		}
		t, ok := list.Tools[tool]
		return t.InputSchema, ok && t.InputSchema != nil
	}
	if found := policy.LintArguments(r.Policy, schemas); len(found) > 0 {
		return fmt.Errorf("policy: %s", strings.Join(found, "; "))
	}
	return nil
}
