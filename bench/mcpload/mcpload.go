// Package mcpload drives MCP tools/call load through Envoy on raw HTTP,
// as e2e/hostile_test.go speaks it: each worker opens its own session
// (initialize, notifications/initialized, tools/list, which mints
// capsnap's snapshot), then posts the same call again and again. Raw
// requests keep the load generator cheap and every byte on the wire
// known; every answer is still read in full and judged.
package mcpload

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// ProtocolVersion is the MCP version the sessions speak: one message per
// POST, with a session (so each worker has a snapshot of its own).
const ProtocolVersion = "2025-06-18"

// EpochHeader is where capsnap returns the snapshot epoch at tools/list,
// and where a call names it.
const EpochHeader = "x-capsnap-epoch"

// Session is one agent's connection to an MCP server: a session (Open),
// or stateless requests (Dial).
type Session struct {
	client *http.Client
	url    string
	// header is sent with every request: the caller's (the principal) and
	// the session's own.
	header http.Header
}

// Dial is a connection to url that posts with header, for stateless
// requests (no session): one connection, kept alive, as one agent's.
func Dial(url string, header map[string]string) *Session {
	s := &Session{
		client: &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}},
		url:    url,
		header: http.Header{},
	}
	for k, v := range header {
		s.header.Set(k, v)
	}
	return s
}

// Open starts a session on url (Envoy's route to the MCP server) sending
// header with every request, and lists tools once.
func Open(ctx context.Context, url string, header map[string]string) (*Session, error) {
	s := Dial(url, header)
	init := fmt.Sprintf(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"capsnap-bench","version":"1"}}}`, ProtocolVersion)
	r, err := s.Post(ctx, []byte(init))
	if err != nil {
		return nil, err
	}
	if !r.OK() || r.Header.Get("Mcp-Session-Id") == "" {
		return nil, fmt.Errorf("initialize: %s", r)
	}
	s.header.Set("Mcp-Session-Id", r.Header.Get("Mcp-Session-Id"))
	s.header.Set("Mcp-Protocol-Version", ProtocolVersion)
	if r, err = s.Post(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil {
		return nil, err
	}
	if r.Status/100 != 2 {
		return nil, fmt.Errorf("notifications/initialized: %s", r)
	}
	return s, s.List(ctx)
}

// List lists tools, and so mints a new snapshot where capsnap decides,
// whose epoch later calls name.
func (s *Session) List(ctx context.Context) error {
	s.header.Del(EpochHeader)
	r, err := s.Post(ctx, []byte(`{"jsonrpc":"2.0","id":"list","method":"tools/list","params":{}}`))
	if err == nil && !r.OK() {
		err = fmt.Errorf("tools/list: %s", r)
	}
	if epoch := r.Header.Get(EpochHeader); epoch != "" {
		s.header.Set(EpochHeader, epoch)
	}
	return err
}

// Reply is what an MCP POST came back with.
type Reply struct {
	Status int
	Header http.Header
	// Error is the JSON-RPC error's message, or the text of a tool
	// result that is an error; "" when the request succeeded.
	Error string
	// Reason is the refusal's stable reason: capsnap's x-capsnap-reason
	// header, or the JSON-RPC error's data.reason (pincheck's
	// handler_drift).
	Reason string
	Body   []byte
}

// OK is a 2xx answer that is not an error.
func (r Reply) OK() bool { return r.Status/100 == 2 && r.Error == "" }

func (r Reply) String() string {
	s := fmt.Sprintf("HTTP %d", r.Status)
	if r.Reason != "" {
		s += ", reason " + r.Reason
	}
	if r.Error != "" {
		s += ": " + r.Error
	}
	return s
}

// Post sends one JSON-RPC message on the session and reads the whole
// answer. An error is a transport failure; an answer that refuses the
// request is a Reply that is not OK.
func (s *Session) Post(ctx context.Context, body []byte) (Reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return Reply{}, err
	}
	req.Header = s.header.Clone()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := s.client.Do(req)
	if err != nil {
		return Reply{}, fmt.Errorf("POST %s: %w", s.url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Reply{}, fmt.Errorf("POST %s: %w", s.url, err)
	}
	r := Reply{Status: resp.StatusCode, Header: resp.Header, Body: b}
	r.Error, r.Reason = replyError(resp.Header.Get("Content-Type"), b)
	if r.Status/100 != 2 && r.Error == "" {
		r.Error = strings.TrimSpace(string(b))
	}
	if reason := resp.Header.Get("x-capsnap-reason"); reason != "" {
		r.Reason = reason
	}
	return r, nil
}

// Close ends the session's connections.
func (s *Session) Close() { s.client.CloseIdleConnections() }

// replyError is the error a JSON-RPC answer carries, whether sent as JSON
// or as server-sent events, and its data.reason if it has one; "" for a
// successful result or no message.
func replyError(contentType string, body []byte) (text, reason string) {
	if strings.HasPrefix(contentType, "text/event-stream") {
		var last []byte // the answer is the last event's data
		for _, line := range bytes.Split(body, []byte("\n")) {
			if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				last = bytes.TrimSpace(d)
			}
		}
		body = last
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return "", ""
	}
	var msg struct {
		Error *struct {
			Message string          `json:"message"`
			Data    json.RawMessage `json:"data"`
		} `json:"error"`
		Result *struct {
			IsError bool `json:"isError"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"result"`
	}
	if err := json.Unmarshal(body, &msg); err != nil {
		return "unreadable answer: " + err.Error(), ""
	}
	switch {
	case msg.Error != nil:
		// Data that is not an object, or a reason that is not a string, is
		// no reason.
		var data struct {
			Reason string `json:"reason"`
		}
		_ = json.Unmarshal(msg.Error.Data, &data)
		return "JSON-RPC error: " + msg.Error.Message, data.Reason
	case msg.Result != nil && msg.Result.IsError:
		text := "tool error"
		if len(msg.Result.Content) > 0 {
			text += ": " + msg.Result.Content[0].Text
		}
		return text, ""
	}
	return "", ""
}

// Load is one call posted by a fixed number of workers, each on its own
// session.
type Load struct {
	// URL is Envoy's route; Header is sent on every request.
	URL    string
	Header map[string]string
	// Setup is sent once on each session before the load (lookup_order,
	// which capsnap's sequence rule wants before a refund); Call is the
	// call under load.
	Setup, Call []byte
	Workers     int
	// Warmup is run once, when the load starts, and discarded.
	Warmup time.Duration
}

// Runner is a started Load: its sessions are open and warm, and it
// measures in bounded stretches, so that loads of several servers can
// take turns.
type Runner struct {
	l        Load
	sessions []*Session
}

// Start opens the sessions, sends their Setup and warms up. Any failed
// call is an error: the benchmark measures successful calls only.
func (l Load) Start(ctx context.Context) (*Runner, error) {
	r := &Runner{l: l}
	for range l.Workers {
		s, err := Open(ctx, l.URL, l.Header)
		if err == nil {
			r.sessions = append(r.sessions, s)
			var reply Reply
			if reply, err = s.Post(ctx, l.Setup); err == nil && !reply.OK() {
				err = fmt.Errorf("setup call: %s", reply)
			}
		}
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("open session: %w", err)
		}
	}
	if _, err := r.Measure(ctx, l.Warmup, math.MaxInt); err != nil {
		r.Close()
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	return r, nil
}

// Close ends the sessions' connections.
func (r *Runner) Close() {
	for _, s := range r.sessions {
		s.Close()
	}
}

// Sample is one measured stretch.
type Sample struct {
	Latencies []time.Duration
	Elapsed   time.Duration
}

// Measure has every worker post the call until d has passed or it made
// perWorker calls. A failed call is an error.
func (r *Runner) Measure(ctx context.Context, d time.Duration, perWorker int) (Sample, error) {
	made := make([]int, len(r.sessions))
	more := func(w int) bool { made[w]++; return made[w] <= perWorker }
	return Workers(ctx, len(r.sessions), d, more, func(w int) (time.Duration, error) {
		start := time.Now()
		reply, err := r.sessions[w].Post(ctx, r.l.Call)
		took := time.Since(start)
		if err == nil && !reply.OK() {
			err = fmt.Errorf("call: %s", reply)
		}
		return took, err
	})
}

// Workers times the calls of n workers at once: worker w calls call(w),
// which returns the time it measured, over and over until d has passed,
// more(w) is false or a call fails. Any failed call fails the sample.
func Workers(ctx context.Context, n int, d time.Duration, more func(w int) bool, call func(w int) (time.Duration, error)) (Sample, error) {
	var (
		mu     sync.Mutex
		sample Sample
		first  error
		wg     sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range n {
		wg.Go(func() {
			var own []time.Duration
			var err error
			for err == nil && more(w) && time.Now().Before(deadline) && ctx.Err() == nil {
				var took time.Duration
				if took, err = call(w); err == nil {
					own = append(own, took)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			sample.Latencies = append(sample.Latencies, own...)
			if first == nil {
				first = err
			}
		})
	}
	wg.Wait()
	sample.Elapsed = time.Since(start)
	switch {
	case ctx.Err() != nil:
		return sample, ctx.Err()
	case first != nil:
		return sample, first
	case len(sample.Latencies) == 0:
		return sample, fmt.Errorf("no call was made")
	}
	return sample, nil
}

// Result is the figures of one or more samples of the same load.
type Result struct {
	Calls   int           `json:"calls"`
	Elapsed time.Duration `json:"elapsed_ns"`
	RPS     float64       `json:"rps"`
	Mean    time.Duration `json:"mean_ns"`
	P50     time.Duration `json:"p50_ns"`
	P90     time.Duration `json:"p90_ns"`
	P99     time.Duration `json:"p99_ns"`
	Max     time.Duration `json:"max_ns"`
}

// Summarize merges samples into one result: their calls over their
// time, and the percentiles of all their latencies.
func Summarize(samples ...Sample) Result {
	var all []time.Duration
	var res Result
	for _, s := range samples {
		all = append(all, s.Latencies...)
		res.Elapsed += s.Elapsed
	}
	res.Calls = len(all)
	if res.Calls == 0 {
		return res
	}
	slices.Sort(all)
	var sum time.Duration
	for _, d := range all {
		sum += d
	}
	res.Mean = sum / time.Duration(len(all))
	res.P50, res.P90, res.P99, res.Max = Percentile(all, 50), Percentile(all, 90), Percentile(all, 99), all[len(all)-1]
	res.RPS = float64(len(all)) / res.Elapsed.Seconds()
	return res
}

// Percentile is the p-th percentile of sorted (nearest rank).
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}
