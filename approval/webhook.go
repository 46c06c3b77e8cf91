package approval

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// WebhookConfig says where to announce new requests.
type WebhookConfig struct {
	// URL receives a POST of a JSON body for each request opened. The body's
	// "text" is what a Slack-style incoming webhook shows; "approval" holds
	// the same as fields. Empty: no webhook.
	URL string
	// Timeout bounds each POST; 5 s if zero.
	Timeout time.Duration
	// Queue bounds the announcements waiting to be sent; 100 if zero.
	// One that finds the queue full is dropped, logged and counted.
	Queue int
}

// WebhookBody is what the webhook receives: a request opened (Approval),
// or a principal that hit the bound on new requests (Limited).
type WebhookBody struct {
	Text     string           `json:"text"`
	Approval *WebhookApproval `json:"approval,omitempty"`
	Limited  *WebhookLimited  `json:"limited,omitempty"`
}

// WebhookLimited is a principal that opened as many requests in the window
// as it may: its next held calls are denied, and page no one, until the
// oldest stops counting.
type WebhookLimited struct {
	Principal     string    `json:"principal"`
	Max           int       `json:"max"`
	WindowSeconds int64     `json:"window_seconds"`
	Until         time.Time `json:"until"`
}

// WebhookApproval is a new request, as the webhook is told it: everything
// but the arguments, which only an approver signed in to the page sees.
type WebhookApproval struct {
	ID           string    `json:"id"`
	URL          string    `json:"url"`
	Principal    string    `json:"principal"`
	Server       string    `json:"server"`
	Tool         string    `json:"tool"`
	EffectClass  string    `json:"effect_class"`
	Rule         string    `json:"rule"`
	SchemaDigest string    `json:"schema_digest"`
	PolicyDigest string    `json:"policy_digest"`
	ArgsDigest   string    `json:"args_digest"`
	Approvers    []string  `json:"approvers"`
	Created      time.Time `json:"created_at"`
	Expires      time.Time `json:"expires_at"`
}

// webhook posts announcements from a bounded queue, one at a time, on a
// goroutine of its own: a slow or failing receiver delays no decision.
type webhook struct {
	url     string
	client  *http.Client
	queue   chan WebhookBody
	log     zerolog.Logger
	metrics *metrics
	stop    context.CancelFunc
	ctx     context.Context
	done    chan struct{}
}

// newWebhook starts the webhook c configures; nil when it has no URL.
func newWebhook(c WebhookConfig, log zerolog.Logger, m *metrics) (*webhook, error) {
	if c.URL == "" {
		return nil, nil
	}
	if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("approval: the webhook URL must be an absolute http or https URL")
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	if c.Queue <= 0 {
		c.Queue = 100
	}
	ctx, stop := context.WithCancel(context.Background())
	w := &webhook{
		url: c.URL, client: &http.Client{Timeout: c.Timeout}, queue: make(chan WebhookBody, c.Queue),
		log: log, metrics: m, ctx: ctx, stop: stop, done: make(chan struct{}),
	}
	go w.run()
	return w, nil
}

// announce queues r's announcement, or drops it when the queue is full.
func (w *webhook) announce(r Request, link string) {
	if w == nil {
		return
	}
	select {
	case w.queue <- body(r, link):
	default:
		w.metrics.webhooks.WithLabelValues("dropped").Inc()
		w.log.Warn().Str("approval", r.ID).Msg("approval webhook queue full: announcement dropped")
	}
}

// limit queues the announcement that e's principal hit the bound.
func (w *webhook) limit(e *LimitError) {
	if w == nil {
		return
	}
	until := time.Now().Add(e.RetryAfter).UTC()
	text := fmt.Sprintf("capsnap: %s opened %d approval requests within %s, the most it may; its held calls are denied, and page no one, until %s",
		slackEscape.Replace(e.Principal), e.Used, e.Window, until.Format(time.RFC3339))
	select {
	case w.queue <- WebhookBody{Text: text, Limited: &WebhookLimited{Principal: e.Principal, Max: e.Max, WindowSeconds: int64(e.Window / time.Second), Until: until}}:
	default:
		w.metrics.webhooks.WithLabelValues("dropped").Inc()
		w.log.Warn().Str("principal", e.Principal).Msg("approval webhook queue full: announcement dropped")
	}
}

func (w *webhook) run() {
	defer close(w.done)
	for {
		select {
		case <-w.ctx.Done():
			return
		case b := <-w.queue:
			if err := w.post(b); err != nil {
				w.metrics.webhooks.WithLabelValues("failed").Inc()
				w.log.Warn().Err(err).Msg("approval webhook failed")
				continue
			}
			w.metrics.webhooks.WithLabelValues("sent").Inc()
		}
	}
}

func (w *webhook) post(b WebhookBody) error {
	data, err := json.Marshal(b)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(w.ctx, http.MethodPost, w.url, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s", w.url, resp.Status)
	}
	return nil
}

func (w *webhook) close() {
	if w == nil {
		return
	}
	w.stop()
	<-w.done
}

// slackEscape escapes what Slack's text reads as markup, so that a
// principal or rule cannot make a link of its own.
var slackEscape = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

func body(r Request, link string) WebhookBody {
	b := r.Binding
	text := fmt.Sprintf("capsnap: %s asks to call %s on %s (%s), held for approval by %s. Approve or deny before %s: %s",
		slackEscape.Replace(b.Principal), slackEscape.Replace(b.Tool), slackEscape.Replace(b.Server),
		slackEscape.Replace(r.EffectClass), slackEscape.Replace(r.Rule), r.Expires.UTC().Format(time.RFC3339), link)
	return WebhookBody{Text: text, Approval: &WebhookApproval{
		ID: r.ID, URL: link, Principal: b.Principal, Server: b.Server, Tool: b.Tool,
		EffectClass: r.EffectClass, Rule: r.Rule, SchemaDigest: b.SchemaDigest, PolicyDigest: b.PolicyDigest,
		ArgsDigest: b.ArgsDigest, Approvers: r.Approvers, Created: r.Created, Expires: r.Expires,
	}}
}
