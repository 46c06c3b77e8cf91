package approval_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/storetest"
)

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// tokens is an Authenticator of fixed tokens: the approvers of the tests.
type tokens map[string]approval.Approver

func (t tokens) Authenticate(_ context.Context, tok string) (approval.Approver, error) {
	a, ok := t[tok]
	if !ok {
		return approval.Approver{}, fmt.Errorf("%w: unknown test token", approval.ErrUnauthenticated)
	}
	return a, nil
}

// The requesting agent; the approvers: alice by identity, bob by group;
// carol outside the rule; and the agent itself, in the group, which the
// rule does not let approve its own calls.
const agent = "spiffe://acme/agent/support"

var testTokens = tokens{
	"alice-token": {ID: "alice@acme.example"},
	"bob-token":   {ID: "bob@acme.example", Groups: []string{"billing-oncall"}},
	"carol-token": {ID: "carol@acme.example", Groups: []string{"staff"}},
	"agent-token": {ID: agent, Groups: []string{"billing-oncall"}},
}

// flaky is a store that can be taken down.
type flaky struct {
	approval.Store
	down atomic.Bool
}

var errDown = fmt.Errorf("%w: redis 127.0.0.1:6379: probe: connection refused", store.ErrUnavailable)

func (f *flaky) Get(id string, now time.Time) (approval.Request, error) {
	if f.down.Load() {
		return approval.Request{}, errDown
	}
	return f.Store.Get(id, now)
}

func (f *flaky) List(fl approval.Filter, now time.Time) ([]approval.Request, error) {
	if f.down.Load() {
		return nil, errDown
	}
	return f.Store.List(fl, now)
}

func (f *flaky) Decide(id string, by approval.Approver, approve bool, reason string, now time.Time) (approval.Request, error) {
	if f.down.Load() {
		return approval.Request{}, errDown
	}
	return f.Store.Decide(id, by, approve, reason, now)
}

func (f *flaky) Consume(b approval.Binding, now time.Time) (approval.Request, bool, error) {
	if f.down.Load() {
		return approval.Request{}, false, errDown
	}
	return f.Store.Consume(b, now)
}

// env is a Service on a memory store, its handler served, and what it
// audited.
type env struct {
	svc   *approval.Service
	store *flaky
	clock *clock
	srv   *httptest.Server
	reg   *prometheus.Registry

	mu     sync.Mutex
	events []approval.Event
}

func newEnv(t *testing.T, auth approval.Authenticator, edit ...func(*approval.Config)) *env {
	t.Helper()
	e := &env{store: &flaky{Store: approval.NewMemory(time.Hour)}, clock: &clock{t: time.Now().Truncate(time.Second)}, reg: prometheus.NewRegistry()}
	e.srv = httptest.NewUnstartedServer(nil)
	c := approval.Config{
		Store: e.store, BaseURL: "http://" + e.srv.Listener.Addr().String(), Now: e.clock.Now, Registerer: e.reg,
		Audit: func(ev approval.Event) { e.mu.Lock(); e.events = append(e.events, ev); e.mu.Unlock() },
	}
	for _, ed := range edit {
		ed(&c)
	}
	svc, err := approval.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	e.svc = svc
	h, err := approval.NewHandler(approval.HandlerOptions{Service: svc, Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Config.Handler = h
	e.srv.Start()
	t.Cleanup(e.srv.Close)
	return e
}

// open opens a request of agent's, with arguments that hold markup.
func (e *env) open(t *testing.T, args string) approval.Request {
	t.Helper()
	req := storetest.Request(storetest.Binding(agent, args), e.clock.Now())
	r, err := e.svc.Open(req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (e *env) audited() []approval.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]approval.Event(nil), e.events...)
}

func (e *env) counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := true
			for i, l := range m.GetLabel() {
				if i < len(labels) && l.GetValue() != labels[i] {
					match = false
				}
			}
			if match {
				if m.Counter != nil {
					return m.Counter.GetValue()
				}
				return m.Gauge.GetValue()
			}
		}
	}
	t.Fatalf("no metric %s%v", name, labels)
	return 0
}

// client is an http.Client that follows no redirect.
var client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
