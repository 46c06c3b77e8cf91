package decide

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/store"
)

// unboundCount is capsnap_delivery_unbound_total for server.
func (f *fixture) unboundCount(t *testing.T, server string) float64 {
	t.Helper()
	return testutil.ToFloat64(f.metrics.unbound.WithLabelValues(server))
}

// warnings are the lines a sweep logged at warn, by server_id.
func warnings(t *testing.T, log *bytes.Buffer) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		if strings.Contains(line, `"level":"warn"`) {
			out = append(out, line)
		}
	}
	return out
}

// A listing whose response never comes back is counted once it is
// unboundAfter old, not before; logged at warn once per server, saying
// what to fix; and reported on /readyz for unboundReported.
func TestUnboundListingIsCountedLoggedAndReported(t *testing.T) {
	f := deliveryFixture(t, "")
	var log bytes.Buffer
	logger := zerolog.New(&log)

	if got := f.unboundCount(t, "billing"); got != 0 {
		t.Fatalf("before any listing: %v unbound", got)
	}
	f.ticket(t, support, listRequest(`"a"`, ""))
	f.clock.advance(unboundAfter - time.Millisecond)
	f.unbound.sweep(f.clock.now(), logger)
	if got := f.unboundCount(t, "billing"); got != 0 {
		t.Fatalf("a listing younger than %v counted unbound", unboundAfter)
	}
	if u := f.Unbound(); len(u) != 0 {
		t.Fatalf("/readyz detail before any listing was unbound: %q", u)
	}

	f.clock.advance(time.Millisecond)
	f.unbound.sweep(f.clock.now(), logger)
	if got := f.unboundCount(t, "billing"); got != 1 {
		t.Fatalf("%v unbound, want 1", got)
	}
	w := warnings(t, &log)
	if len(w) != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", len(w), &log)
	}
	for _, want := range []string{`"server_id":"billing"`, "ext_proc", "typed_per_filter_config", "forwarding_namespaces", "no_snapshot", "capsnap check"} {
		if !strings.Contains(w[0], want) {
			t.Errorf("the warning does not say %q: %s", want, w[0])
		}
	}

	// Another, later: counted again, not logged again.
	f.ticket(t, support, listRequest(`"b"`, ""))
	f.clock.advance(unboundAfter)
	f.unbound.sweep(f.clock.now(), logger)
	if got := f.unboundCount(t, "billing"); got != 2 {
		t.Fatalf("%v unbound, want 2", got)
	}
	if w := warnings(t, &log); len(w) != 1 {
		t.Fatalf("%d warnings after the second, want still 1:\n%s", len(w), &log)
	}
	if got := f.unboundCount(t, "payments"); got != 0 {
		t.Errorf("payments: %v unbound, want 0", got)
	}
	u := f.Unbound()
	if len(u) != 1 || !strings.HasPrefix(u[0], "server billing: 2 tools/list responses") || !strings.Contains(u[0], "none has come back") {
		t.Fatalf("/readyz detail %q, want billing's 2 listings, none come back", u)
	}

	// A listing that does come back (the route that skips the filter is
	// one of two): still reported, with when one last came back.
	f.Deliver(f.ticket(t, support, listRequest(`"c"`, "")), okJSON, listResponse(`"c"`, "", f.liveDef(t, "lookup_order")))
	if u := f.Unbound(); len(u) != 1 || !strings.Contains(u[0], "one last came back at "+f.clock.now().UTC().Format(time.RFC3339)) {
		t.Fatalf("/readyz detail %q, want when one last came back", u)
	}

	// A swept ticket is decided once.
	f.clock.advance(unboundAfter)
	f.unbound.sweep(f.clock.now(), logger)
	if got := f.unboundCount(t, "billing"); got != 2 {
		t.Fatalf("%v unbound after another sweep, want 2", got)
	}

	f.clock.advance(unboundReported)
	if u := f.Unbound(); len(u) != 0 {
		t.Fatalf("/readyz detail %v after the window", u)
	}
}

// A listing whose response came back is not unbound, whatever the
// response said: a list, the server's error (404 for an unknown session),
// or one capsnap refused, all came through the response path.
func TestRedeemedListingIsNotUnbound(t *testing.T) {
	f := deliveryFixture(t, "")
	var log bytes.Buffer
	for i, r := range []struct {
		head ResponseHead
		body []byte
	}{
		{okJSON, listResponse(`"l0"`, "", f.liveDef(t, "lookup_order"))},
		{ResponseHead{Status: 404, ContentType: jsonHead}, []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}`)},
		{okJSON, []byte(`{"jsonrpc":"2.0","id":"l2","result":{"tools":[`)},
	} {
		f.Deliver(f.ticket(t, support, listRequest(fmt.Sprintf(`"l%d"`, i), "")), r.head, r.body)
	}
	f.clock.advance(unboundAfter)
	f.unbound.sweep(f.clock.now(), zerolog.New(&log))
	if got := f.unboundCount(t, "billing"); got != 0 {
		t.Fatalf("%v unbound, want 0", got)
	}
	if log.Len() != 0 || len(f.Unbound()) != 0 {
		t.Fatalf("logged %q, /readyz %q; want nothing", &log, f.Unbound())
	}
	if f.unbound.queue != nil || len(f.unbound.watched) != 0 {
		t.Fatalf("%d queued, %d watched after the sweep", len(f.unbound.queue), len(f.unbound.watched))
	}
}

// sharedRedemptions is the shared store's record of redemptions, as
// store/redis keeps it, in memory.
type sharedRedemptions struct {
	mu   sync.Mutex
	done map[string]bool
	err  error
}

var _ store.Redemptions = (*sharedRedemptions)(nil)

func (r *sharedRedemptions) Redeem(tickets []string, _ time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	for _, t := range tickets {
		r.done[t] = true
	}
	return nil
}

func (r *sharedRedemptions) Redeemed(tickets []string) ([]bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return nil, r.err
	}
	out := make([]bool, len(tickets))
	for i, t := range tickets {
		out[i] = r.done[t]
	}
	return out, nil
}

// sharedStore is a replica's own store whose redemptions are the ones
// every replica of the test shares.
type sharedStore struct {
	store.Backend
	shared *sharedRedemptions
}

func (s sharedStore) Redeem(tickets []string, keep time.Duration) error {
	return s.shared.Redeem(tickets, keep)
}

func (s sharedStore) Redeemed(tickets []string) ([]bool, error) { return s.shared.Redeemed(tickets) }

// Envoy sends a listing's Check to replica A and its response to replica
// B: B records the redemption in the store they share, and A, which issued
// the ticket, does not count it. Without the record it would; and a store
// that cannot answer counts nothing.
func TestRedeemedOnAnotherReplicaIsNotUnbound(t *testing.T) {
	shared := &sharedRedemptions{done: map[string]bool{}}
	replica := func() *fixture {
		return deliveryFixture(t, "", func(o *Options) {
			o.Snapshots = sharedStore{o.Snapshots, shared}
		})
	}
	a, b := replica(), replica()
	var log bytes.Buffer
	logger := zerolog.New(&log)

	// Redeemed on B and recorded: not unbound on A.
	out := b.Deliver(a.ticket(t, support, listRequest(`"x"`, "")), okJSON, listResponse(`"x"`, "", a.liveDef(t, "lookup_order")))
	if out.Fail != nil {
		t.Fatal(out.Fail)
	}
	select {
	case <-b.unbound.wake:
	default:
		t.Fatal("B redeemed A's ticket and was not woken to record it")
	}
	b.unbound.flush(logger)
	if len(shared.done) != 1 {
		t.Fatalf("the shared store holds %d redemptions, want 1", len(shared.done))
	}
	a.clock.advance(unboundAfter)
	a.unbound.sweep(a.clock.now(), logger)
	if got := a.unboundCount(t, "billing"); got != 0 {
		t.Fatalf("A counts %v unbound, want 0", got)
	}
	if at := a.unbound.paths["billing"].redeemed; !at.Equal(a.clock.now()) {
		t.Errorf("A notes billing's listings last came back at %v, want %v", at, a.clock.now())
	}

	// Redeemed on B but never recorded (B stopped first): A counts it.
	b.Deliver(a.ticket(t, support, listRequest(`"y"`, "")), okJSON, listResponse(`"y"`, "", a.liveDef(t, "lookup_order")))
	b.unbound.mu.Lock()
	b.unbound.remote = nil
	b.unbound.mu.Unlock()
	a.clock.advance(unboundAfter)
	a.unbound.sweep(a.clock.now(), logger)
	if got := a.unboundCount(t, "billing"); got != 1 {
		t.Fatalf("A counts %v unbound, want 1", got)
	}

	// The store cannot say: not counted.
	a.ticket(t, support, listRequest(`"z"`, ""))
	shared.mu.Lock()
	shared.err = errors.New("store unavailable")
	shared.mu.Unlock()
	a.clock.advance(unboundAfter)
	a.unbound.sweep(a.clock.now(), logger)
	if got := a.unboundCount(t, "billing"); got != 1 {
		t.Fatalf("A counts %v unbound with the store down, want still 1", got)
	}
	// Nothing of B's own: B watches none of these.
	b.clock.advance(2 * unboundAfter)
	b.unbound.sweep(b.clock.now(), logger)
	if got := b.unboundCount(t, "billing"); got != 0 {
		t.Fatalf("B counts %v unbound, want 0", got)
	}
}

// An agent flooding tools/list on a broken response path fills the watch
// only to its bound; the redemptions waiting for the shared store are
// bounded too; a sweep empties what fell due.
func TestUnboundIsBounded(t *testing.T) {
	u := newUnbound([]string{"billing"}, &sharedRedemptions{done: map[string]bool{}}, nil, true)
	now := time.Unix(1_800_000_000, 0)
	for i := range maxWatched + 10 {
		u.issued("billing", fmt.Sprintf("payload.%016d", i), now)
	}
	if len(u.queue) != maxWatched || len(u.watched) != maxWatched {
		t.Fatalf("%d queued, %d watched, want %d", len(u.queue), len(u.watched), maxWatched)
	}
	for i := range maxRemote + 10 {
		u.redeemed("billing", fmt.Sprintf("payload.r%015d", i), now)
	}
	if len(u.remote) != maxRemote {
		t.Fatalf("%d redemptions waiting, want %d", len(u.remote), maxRemote)
	}
	u.sweep(now.Add(unboundAfter), zerolog.Nop())
	if u.queue != nil || len(u.watched) != 0 || u.paths["billing"].unbound != maxWatched {
		t.Fatalf("after the sweep: %d queued, %d watched, %d unbound", len(u.queue), len(u.watched), u.paths["billing"].unbound)
	}
	// A ticket for a server not configured, or that is not a ticket, is
	// not watched.
	u.issued("nowhere", "payload.0123456789abcdef", now)
	u.issued("billing", "no-mac", now)
	if len(u.queue) != 0 {
		t.Fatalf("%d queued, want none", len(u.queue))
	}
}

// The watch stops with its context and leaves no goroutine behind; with
// the catalog binding there is no response path to watch.
func TestWatchResponsePathStops(t *testing.T) {
	f := deliveryFixture(t, "")
	catalogBound := newFixture(t, func(o *Options) { o.Bind = config.BindCatalog })
	ignore := goleak.IgnoreCurrent()
	defer goleak.VerifyNone(t, ignore)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch := func(s *Server) chan struct{} {
		done := make(chan struct{})
		go func() { s.WatchResponsePath(ctx, zerolog.Nop()); close(done) }()
		return done
	}
	returned := func(done chan struct{}) bool {
		select {
		case <-done:
			return true
		case <-time.After(5 * time.Second):
			return false
		}
	}
	if !returned(watch(catalogBound.Server)) {
		t.Fatal("with the catalog binding, WatchResponsePath did not return at once")
	}
	done := watch(f.Server)
	select {
	case <-done:
		t.Fatal("WatchResponsePath returned before its context ended")
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	if !returned(done) {
		t.Fatal("WatchResponsePath did not return when its context ended")
	}
}

// A listing whose upstream aborted it mid-body came back through the
// response path: it is counted and audited upstream_aborted, never as
// unbound; a forged ticket is unknown_listing.
func TestAbortedListingIsNotUnbound(t *testing.T) {
	f := deliveryFixture(t, "")
	var log bytes.Buffer
	f.Aborted(f.ticket(t, support, listRequest(`"l0"`, "")), okJSON)
	f.Aborted("forged.ticket", okJSON)
	f.clock.advance(unboundAfter)
	f.unbound.sweep(f.clock.now(), zerolog.New(&log))
	if got := f.unboundCount(t, "billing"); got != 0 || log.Len() != 0 {
		t.Fatalf("%v unbound, logged %q; want none", got, &log)
	}
	for reason, want := range map[deny.Reason]float64{deny.UpstreamAborted: 1, deny.UnknownListing: 1} {
		server := "billing"
		if reason == deny.UnknownListing {
			server = "unknown"
		}
		if got := testutil.ToFloat64(f.metrics.deliveries.WithLabelValues(server, string(reason))); got != want {
			t.Errorf("deliveries_total{%s,%s} = %v, want %v", server, reason, got, want)
		}
	}
	if !strings.Contains(f.audit.String(), `"reason":"upstream_aborted"`) {
		t.Errorf("no upstream_aborted audit line:\n%s", f.audit.String())
	}
}
