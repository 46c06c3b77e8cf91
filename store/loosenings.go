package store

import (
	"errors"
	"fmt"
	"time"
)

// Acceptance is a person's acceptance of a policy looser than the one in
// force, made on one replica and recorded for every replica that shares
// the store: each may then put exactly those files in force, and no other
// (decide's Reload).
type Acceptance struct {
	// Source names the files accepted: "sha256:" and the hex SHA-256 of
	// the policy file's bytes and its lockfile's.
	Source string `json:"source"`
	// PolicyDigest is the accepted policy's digest, for people.
	PolicyDigest string `json:"policy_digest"`
	// By and Reason are who accepted it and why, as they said.
	By     string `json:"by"`
	Reason string `json:"reason"`
	// At is when it was accepted; Until when the record lapses.
	At    time.Time `json:"at"`
	Until time.Time `json:"until"`
}

// MaxAcceptance bounds how long an acceptance is kept: a replica that sees
// the accepted files later than that needs a new one.
const MaxAcceptance = 24 * time.Hour

// Loosenings are the acceptances of looser policies, fleet-wide.
type Loosenings interface {
	// AcceptLoosening records a, until a.Until, in place of any
	// acceptance of the same source.
	AcceptLoosening(a Acceptance) error
	// AcceptedLoosening returns the acceptance of source, if one is
	// recorded and has not lapsed.
	AcceptedLoosening(source string) (Acceptance, bool, error)
}

var (
	errAcceptance = errors.New("store: an acceptance needs a source, someone who accepts, a reason, and an until after its time and at most MaxAcceptance later")
	errLapsed     = errors.New("store: the acceptance has lapsed")
)

// Check reports whether a is an acceptance a store keeps at now: every
// backend refuses one without a source, a person, a reason or a bounded
// life, or one that has lapsed.
func (a Acceptance) Check(now time.Time) error {
	switch {
	case a.Source == "" || a.By == "" || a.Reason == "" || !a.Until.After(a.At) || a.Until.Sub(a.At) > MaxAcceptance:
		return errAcceptance
	case !now.Before(a.Until):
		return fmt.Errorf("%w: %s, at %s", errLapsed, a.Source, a.Until.UTC().Format(time.RFC3339))
	}
	return nil
}

// AcceptLoosening implements Loosenings.
func (m *Memory) AcceptLoosening(a Acceptance) error {
	now := m.now()
	if err := a.Check(now); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// What has lapsed goes first, so that the map holds what is kept.
	for source, kept := range m.accepted {
		if !now.Before(kept.Until) {
			delete(m.accepted, source)
		}
	}
	if m.accepted == nil {
		m.accepted = map[string]Acceptance{}
	}
	m.accepted[a.Source] = a
	return nil
}

// AcceptedLoosening implements Loosenings.
func (m *Memory) AcceptedLoosening(source string) (Acceptance, bool, error) {
	now := m.now()
	m.mu.RLock()
	defer m.mu.RUnlock()
	a, ok := m.accepted[source]
	if !ok || !now.Before(a.Until) {
		return Acceptance{}, false, nil
	}
	return a, true, nil
}
