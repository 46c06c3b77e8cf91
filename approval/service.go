package approval

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Config configures a Service.
type Config struct {
	// Store keeps the requests: NewMemory for one replica, the Redis
	// store (store/redis.NewApprovals) for several.
	Store Store
	// BaseURL is where approvers reach the approval listener
	// ("https://approvals.acme.example"); a request's page is
	// BaseURL/approvals/<id>.
	BaseURL string
	// PendingTTL is how long a request waits for a person before it
	// lapses; 15 minutes if zero.
	PendingTTL time.Duration
	// DeniedFor is how long a denial of a held call stands
	// (Request.DeniedFor); zero: not at all, the next identical call opens
	// a new request.
	DeniedFor time.Duration
	// MaxNew bounds the requests one principal may open in Window: past
	// it, Open refuses with a *LimitError, counted, and announced to the
	// webhook once a window, so a looping agent cannot flood approvers.
	// Zero: no bound.
	MaxNew int
	Window time.Duration
	// Audit, if set, is called with every request opened, decision,
	// consumption and expiry, before the operation returns: capsnap
	// writes each to its signed audit trail.
	Audit func(Event)
	// Webhook, if its URL is set, is told of every request opened.
	Webhook WebhookConfig
	// Registerer, if set, gets the metrics.
	Registerer prometheus.Registerer
	// Log gets the webhook's failures and the sweeps'.
	Log zerolog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// EventKind names what happened to a request, as the audit trail says it.
type EventKind string

const (
	EventRequested EventKind = "approval_requested"
	EventApproved  EventKind = "approval_approved"
	EventDenied    EventKind = "approval_denied"
	EventConsumed  EventKind = "approval_consumed"
	EventExpired   EventKind = "approval_expired"
)

// Event is one change to a request, for the audit trail. Request is the
// request after it; its arguments are for the approver's eyes, and the
// trail records the Binding's ArgsDigest instead, as it does for calls.
type Event struct {
	Kind    EventKind
	Request Request
	// Approver is who decided, with the groups their token carried, for
	// Granted and Refused.
	Approver Approver
}

// Service is the approvals of one capsnap: the decision core opens
// requests and consumes approvals through it, the approval page and API
// decide them, and it audits, counts and announces each.
type Service struct {
	c       Config
	base    string
	metrics *metrics
	hook    *webhook
	// announced is when each principal's bound was last announced.
	mu        sync.Mutex
	announced map[string]time.Time
}

// ErrTooManyRequests is what a *LimitError is.
var ErrTooManyRequests = errors.New("approval: too many requests opened by this principal")

// LimitError is Open's refusal of a principal that opened MaxNew requests
// in the window: how many it opened, and when the oldest stops counting.
type LimitError struct {
	Principal  string
	Max, Used  int
	Window     time.Duration
	RetryAfter time.Duration
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("approval: %s opened %d approval requests in %s, the most allowed: retry in %s", e.Principal, e.Used, e.Window, e.RetryAfter.Round(time.Second))
}

// Is makes errors.Is(err, ErrTooManyRequests) hold.
func (e *LimitError) Is(target error) bool { return target == ErrTooManyRequests }

// DefaultPendingTTL is how long a request waits for a person unless
// Config.PendingTTL says otherwise.
const DefaultPendingTTL = 15 * time.Minute

// New returns a Service. Close stops its webhook.
func New(c Config) (*Service, error) {
	if c.Store == nil {
		return nil, errors.New("approval: a store is required")
	}
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, errors.New("approval: the base URL must be an absolute http or https URL, without query or fragment")
	}
	if c.PendingTTL <= 0 {
		c.PendingTTL = DefaultPendingTTL
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxNew > 0 && c.Window <= 0 {
		return nil, errors.New("approval: a bound on new requests needs a positive window")
	}
	s := &Service{c: c, base: strings.TrimSuffix(c.BaseURL, "/"), metrics: newMetrics(c.Registerer), announced: map[string]time.Time{}}
	if s.hook, err = newWebhook(c.Webhook, c.Log, s.metrics); err != nil {
		return nil, err
	}
	return s, nil
}

// Close stops the webhook; announcements still queued are dropped.
func (s *Service) Close() { s.hook.close() }

// URL is request id's page.
func (s *Service) URL(id string) string { return s.base + "/approvals/" + id }

// secure reports whether approvers reach the page over HTTPS.
func (s *Service) secure() bool { return strings.HasPrefix(s.base, "https://") }

func (s *Service) audit(e Event) {
	if s.c.Audit != nil {
		s.c.Audit(e)
	}
}

// Open asks for a person's approval of the call req describes: its
// Binding, Arguments, EffectClass, Rule, Approvers, SelfApprove and
// ApprovalTTL, from the policy's rule. It returns the request the call
// waits on: the binding's live one if there is one (an agent's retry opens
// no second request), or else a new one, pending for PendingTTL, which is
// audited, counted and announced to the webhook. The caller's denial names
// its ID, URL(ID) and Expires.
func (s *Service) Open(req Request) (Request, error) {
	now := s.c.Now()
	pending := s.c.PendingTTL
	if req.Change != nil && req.Change.Wait > 0 {
		pending = req.Change.Wait
	}
	req.ID, req.Created, req.Expires, req.State = NewID(), now, now.Add(pending), Pending
	req.DecidedBy, req.DecidedAt, req.Reason = "", time.Time{}, ""
	if req.Change == nil {
		req.DeniedFor = s.c.DeniedFor
		if err := s.bound(req, now); err != nil {
			return Request{}, err
		}
	}
	r, opened, err := s.c.Store.Open(req, now)
	if err != nil {
		return Request{}, err
	}
	if opened {
		s.metrics.event(EventRequested).Inc()
		s.audit(Event{Kind: EventRequested, Request: r})
		s.hook.announce(r, s.URL(r.ID))
	}
	return r, nil
}

// bound refuses req when its principal opened MaxNew requests in the
// window and none of them holds req's binding (a retry of a held call
// opens nothing, and is never refused).
func (s *Service) bound(req Request, now time.Time) error {
	if s.c.MaxNew <= 0 {
		return nil
	}
	mine, err := s.c.Store.List(Filter{Principal: req.Binding.Principal}, now)
	if err != nil {
		return err
	}
	used, oldest := 0, now
	for _, r := range mine {
		if r.Binding == req.Binding && r.Holds(now) {
			return nil
		}
		if now.Sub(r.Created) < s.c.Window {
			used++
			if r.Created.Before(oldest) {
				oldest = r.Created
			}
		}
	}
	if used < s.c.MaxNew {
		return nil
	}
	e := &LimitError{Principal: req.Binding.Principal, Max: s.c.MaxNew, Used: used, Window: s.c.Window, RetryAfter: oldest.Add(s.c.Window).Sub(now)}
	s.metrics.limited.Inc()
	s.mu.Lock()
	last, told := s.announced[e.Principal]
	if !told || now.Sub(last) >= s.c.Window {
		s.announced[e.Principal] = now
		s.mu.Unlock()
		s.hook.limit(e)
	} else {
		s.mu.Unlock()
	}
	return e
}

// Consume uses up the approval of exactly the call b binds, if a person
// granted one that has not expired: ok is true once, and the call may run.
// With ok false the call still needs approval (Open); with an error the
// store cannot answer, and the call must be denied.
func (s *Service) Consume(b Binding) (r Request, ok bool, err error) {
	r, ok, err = s.c.Store.Consume(b, s.c.Now())
	if err != nil || !ok {
		return Request{}, false, err
	}
	s.metrics.event(EventConsumed).Inc()
	s.audit(Event{Kind: EventConsumed, Request: r})
	return r, true, nil
}

// Get returns request id as it stands now.
func (s *Service) Get(id string) (Request, error) {
	if !ValidID(id) {
		return Request{}, ErrNotFound
	}
	return s.c.Store.Get(id, s.c.Now())
}

// List returns the requests f selects, newest first.
func (s *Service) List(f Filter) ([]Request, error) { return s.c.Store.List(f, s.c.Now()) }

// Decide records by's decision on request id, audited before it returns.
func (s *Service) Decide(id string, by Approver, approve bool, reason string) (Request, error) {
	if !ValidID(id) {
		return Request{}, ErrNotFound
	}
	r, err := s.c.Store.Decide(id, by, approve, reason, s.c.Now())
	if err != nil {
		return Request{}, err
	}
	kind := EventDenied
	if approve {
		kind = EventApproved
	}
	s.metrics.event(kind).Inc()
	s.audit(Event{Kind: kind, Request: r, Approver: by})
	return r, nil
}

// Sweep marks the requests that lapsed expired, auditing and counting
// each (once, whichever replica sweeps it), and sets the pending gauge.
func (s *Service) Sweep() error {
	now := s.c.Now()
	lapsed, err := s.c.Store.Expire(now)
	if err != nil {
		return err
	}
	for _, r := range lapsed {
		s.metrics.event(EventExpired).Inc()
		s.audit(Event{Kind: EventExpired, Request: r})
	}
	pending, err := s.c.Store.List(Filter{State: Pending}, now)
	if err != nil {
		return err
	}
	s.metrics.pending.Set(float64(len(pending)))
	return nil
}

// Run sweeps every interval until ctx ends.
func (s *Service) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	// A sweep that fails is said once, and again only once one succeeded:
	// a store still connecting at start, or down for a while, is one
	// warning, not one a sweep (its own health is logged by the store).
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := s.Sweep()
		switch {
		case err != nil && !failing:
			s.c.Log.Warn().Err(err).Msg("approval sweep failed; expired requests are marked once the store answers")
		case err == nil && failing:
			s.c.Log.Info().Msg("approval sweep succeeded again")
		}
		failing = err != nil
	}
}
