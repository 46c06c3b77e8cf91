package decide

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/testbed"
)

// fleet is replicas of one policy file on one store: A's, on A's clock.
type fleet struct {
	a, b *fixture
	path string
	base string
	opts []func(*Options)
}

// newFleet starts A and B, under the pack's policy, each with opts.
func newFleet(t *testing.T, opts ...func(*Options)) *fleet {
	t.Helper()
	base, err := os.ReadFile("testdata/pack/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fl := &fleet{path: filepath.Join(t.TempDir(), "policy.yaml"), base: string(base), opts: opts}
	fl.write(t, "args.amount <= 250")
	fl.a = packFixture(t, append([]func(*Options){func(o *Options) { o.Rules = mustRules(t, fl.path) }}, opts...)...)
	fl.b = fl.replica(t)
	return fl
}

// replica starts another replica of the file as it is now, on A's store
// and clock.
func (fl *fleet) replica(t *testing.T) *fixture {
	t.Helper()
	shared := func(o *Options) { o.Rules, o.Snapshots, o.Now = mustRules(t, fl.path), fl.a.snapshots, fl.a.clock.now }
	return packFixture(t, append([]func(*Options){shared}, fl.opts...)...)
}

// write replaces the policy file with the pack's, its refund cap written
// as cap, whole, as editors and ConfigMaps do.
func (fl *fleet) write(t *testing.T, cap string) {
	t.Helper()
	if err := testbed.ReplaceFile(fl.path, []byte(strings.Replace(fl.base, "args.amount <= 250", cap, 1))); err != nil {
		t.Fatal(err)
	}
}

var alice = Signoff{By: "alice@acme.example", Reason: "INC-42: refunds up to USD 500 this week"}

// loosened is the policy_loosened lines of f's audit trail.
func loosened(t *testing.T, f *fixture) []map[string]any {
	t.Helper()
	var out []map[string]any
	if f.audit.Len() == 0 {
		return nil
	}
	for _, l := range auditLines(t, f) {
		if l["event"] == "policy_loosened" {
			out = append(out, l)
		}
	}
	return out
}

// A loosening accepted on one replica is put in force on every other that
// shares the store, for exactly the files accepted, audited on each with
// who accepted it and why; other files stay refused.
func TestLooseningAcceptedOnceForEveryReplica(t *testing.T) {
	fl := newFleet(t)
	over := argsCall("refund", `{"order_id":"A-100","amount":400,"reason_code":"damaged"}`)
	fl.write(t, "args.amount <= 500")
	for name, f := range map[string]*fixture{"A": fl.a, "B": fl.b} {
		if r, err := f.Reload(fl.path, nil); r != ReloadLoosening || !errors.Is(err, ErrLoosening) {
			t.Fatalf("%s before any acceptance: %s, %v", name, r, err)
		}
	}
	if r, err := fl.a.Reload(fl.path, &alice); r != ReloadOK || err != nil {
		t.Fatalf("A accepting the looser policy: %s, %v", r, err)
	}
	if r, err := fl.b.Reload(fl.path, nil); r != ReloadOK || err != nil {
		t.Fatalf("B after A accepted: %s, %v", r, err)
	}
	if a, b := fl.a.rules.Load().Policy.Digest(), fl.b.rules.Load().Policy.Digest(); a != b {
		t.Fatalf("A enforces %s, B %s", a, b)
	}
	fl.b.list(t, support, "billing", nil)
	fl.b.call(t, argsCall("lookup_order", lookup))
	if got := fl.b.call(t, over); got.reason != "" {
		t.Fatalf("B under the accepted cap: %q (%s)", got.reason, got.data.Detail)
	}
	for name, tt := range map[string]struct {
		f   *fixture
		via string
	}{"A": {fl.a, "request"}, "B": {fl.b, "store"}} {
		lines := loosened(t, tt.f)
		if len(lines) != 1 {
			t.Fatalf("%s audited %d loosenings, want 1", name, len(lines))
		}
		l := lines[0]
		if l["by"] != alice.By || l["reason"] != alice.Reason || l["accepted_via"] != tt.via ||
			l["policy_digest"] != tt.f.rules.Load().Policy.Digest() || !strings.HasPrefix(l["source"].(string), "sha256:") ||
			!strings.Contains(strings.Join(anyStrings(l["loosenings"]), ";"), "usd_cap_250") {
			t.Errorf("%s's audit line: %v", name, l)
		}
	}

	// Other files, looser still, are refused on both: the acceptance is
	// of the files A read, not of any loosening.
	fl.write(t, "args.amount <= 600")
	for name, f := range map[string]*fixture{"A": fl.a, "B": fl.b} {
		if r, err := f.Reload(fl.path, nil); r != ReloadLoosening || !errors.Is(err, ErrLoosening) {
			t.Fatalf("%s, another looser file: %s, %v", name, r, err)
		}
	}
	if got := testutil.ToFloat64(fl.b.metrics.reloads.WithLabelValues(ReloadLoosening)); got != 2 {
		t.Errorf("B counted %v refusals, want 2", got)
	}
}

// An acceptance is kept for store.MaxAcceptance: a replica that sees the
// accepted files within it puts them in force; one that sees them later
// needs another.
func TestAcceptanceLapses(t *testing.T) {
	fl := newFleet(t)
	c := fl.replica(t)
	fl.write(t, "args.amount <= 500")
	if r, err := fl.a.Reload(fl.path, &alice); r != ReloadOK {
		t.Fatalf("A accepting: %s, %v", r, err)
	}
	fl.a.clock.advance(store.MaxAcceptance - time.Millisecond)
	if r, err := fl.b.Reload(fl.path, nil); r != ReloadOK {
		t.Fatalf("B, within the acceptance: %s, %v", r, err)
	}
	fl.a.clock.advance(time.Millisecond)
	if r, err := c.Reload(fl.path, nil); r != ReloadLoosening || !errors.Is(err, ErrLoosening) {
		t.Fatalf("C, once the acceptance lapsed: %s, %v", r, err)
	}
}

// A signoff says who and why, in bounded, printable words; one that
// does not is refused, and nothing is recorded for the other replicas.
func TestSignoffSaysWhoAndWhy(t *testing.T) {
	for _, tt := range []struct {
		name   string
		accept Signoff
		why    string
	}{
		{"no one", Signoff{Reason: alice.Reason}, "by is required"},
		{"blank", Signoff{By: "  ", Reason: alice.Reason}, "by is required"},
		{"no reason", Signoff{By: alice.By}, "reason is required"},
		{"a long name", Signoff{By: strings.Repeat("a", maxSignoffBy+1), Reason: alice.Reason}, "by is longer than 256 bytes"},
		{"a long reason", Signoff{By: alice.By, Reason: strings.Repeat("a", maxSignoffReason+1)}, "reason is longer than 1024 bytes"},
		{"an escape", Signoff{By: alice.By, Reason: "ok\x1b[2J"}, "reason holds a control character"},
		{"a newline", Signoff{By: "alice\nbob", Reason: alice.Reason}, "by holds a control character"},
		{"not UTF-8", Signoff{By: alice.By, Reason: "\xff"}, "reason holds a control character or is not UTF-8"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.accept.Check(); err == nil || !strings.Contains(err.Error(), tt.why) {
				t.Fatalf("Check: %v, want %q", err, tt.why)
			}
			fl := newFleet(t)
			fl.write(t, "args.amount <= 500")
			if r, err := fl.a.Reload(fl.path, &tt.accept); r != ReloadLoosening || !strings.Contains(fmt.Sprint(err), tt.why) {
				t.Fatalf("A: %s, %v", r, err)
			}
			if r, err := fl.b.Reload(fl.path, nil); r != ReloadLoosening {
				t.Fatalf("B: %s, %v", r, err)
			}
		})
	}
	if err := alice.Check(); err != nil {
		t.Fatal(err)
	}
}

// unrecordingStore is a store that cannot record an acceptance now.
type unrecordingStore struct{ store.Backend }

func (unrecordingStore) AcceptLoosening(store.Acceptance) error {
	return fmt.Errorf("%w: redis is down", store.ErrUnavailable)
}

// An acceptance the store cannot record for every replica is put in force
// on none, this one included: the fleet never runs two policies on one
// person's word.
func TestAcceptanceUnrecordedIsNotInForce(t *testing.T) {
	fl := newFleet(t, func(o *Options) { o.Snapshots = unrecordingStore{o.Snapshots} })
	before := fl.a.rules.Load()
	fl.write(t, "args.amount <= 500")
	r, err := fl.a.Reload(fl.path, &alice)
	if r != ReloadUnrecorded || !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "record the acceptance for every replica") {
		t.Fatalf("A accepting without a store: %s, %v", r, err)
	}
	if fl.a.rules.Load() != before {
		t.Fatal("A put in force a loosening no other replica can see")
	}
	if r, err := fl.b.Reload(fl.path, nil); r != ReloadLoosening {
		t.Fatalf("B: %s, %v", r, err)
	}
	if got := testutil.ToFloat64(fl.a.metrics.reloads.WithLabelValues(ReloadUnrecorded)); got != 1 {
		t.Errorf("counted %v unrecorded reloads, want 1", got)
	}
	if lines := loosened(t, fl.a); len(lines) != 0 {
		t.Errorf("audited a loosening not in force: %v", lines)
	}
}

// B's watcher refuses a looser file once, and puts it in force as soon as
// A records a person's acceptance of it.
func TestWatcherAppliesAnAcceptanceFromAnotherReplica(t *testing.T) {
	fl := newFleet(t)
	var log testbed.SyncBuffer
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { fl.b.WatchPolicy(ctx, fl.path, 5*time.Millisecond, zerolog.New(&log)); close(done) }()
	stop := func() { cancel(); <-done }
	defer func() {
		if ctx.Err() == nil {
			stop()
		}
	}()
	fl.write(t, "args.amount <= 500")
	waitUntil(t, "B's watcher to refuse the looser file", func() bool { return strings.Contains(log.String(), "policy reload refused") })
	time.Sleep(50 * time.Millisecond)
	before := fl.b.rules.Load()
	if r, err := fl.a.Reload(fl.path, &alice); r != ReloadOK {
		t.Fatalf("A accepting: %s, %v", r, err)
	}
	waitUntil(t, "B to put the accepted policy in force", func() bool { return fl.b.rules.Load() != before })
	stop()
	if got, want := fl.b.rules.Load().Policy.Digest(), fl.a.rules.Load().Policy.Digest(); got != want {
		t.Fatalf("B enforces %s, A %s", got, want)
	}
	if n := strings.Count(log.String(), "policy reload refused"); n != 1 {
		t.Errorf("B logged %d refusals, want 1:\n%s", n, log.String())
	}
	if !strings.Contains(log.String(), `"trigger":"accepted on another replica"`) {
		t.Errorf("B's log does not say why it reloaded:\n%s", log.String())
	}
	if lines := loosened(t, fl.b); len(lines) != 1 || lines[0]["by"] != alice.By || lines[0]["accepted_via"] != "store" {
		t.Errorf("B's audit: %v", lines)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func anyStrings(v any) []string {
	var out []string
	if list, ok := v.([]any); ok {
		for _, s := range list {
			out = append(out, fmt.Sprint(s))
		}
	}
	return out
}
