// Command mcpfixture is an MCP server on the official Go SDK for capsnap's
// end-to-end tests of the response path (what an agent is delivered by
// tools/list). It takes the flags testbed.Stack gives a server binary, so it
// can stand in for billing (testbed.StackOptions.Billing), and its own mode
// (testbed.StackOptions.ServerArgs):
//
//	-addr ADDR      listen address; MCP is served at /mcp
//	-variant NAME   ignored: the stack names billing's variants
//	-mode FLAGS     comma-separated behaviour flags, below
//
// Its tools, in every variant (but see tools=N below):
//
//	lookup_order   a read; arguments {order_id}
//	refund         moves money; arguments {order_id, amount, reason_code}
//	summarize      offered only to a client that declared the sampling
//	               capability: tools/list leaves it out for any other (a
//	               receiving middleware that reads the request's client
//	               capabilities: the session's initialize before 2026-07-28,
//	               the request's _meta from 2026-07-28), and a call from any
//	               other is refused with a tool error
//	export_ledger  a tool a policy may leave unclassified
//	wipe_ledger    a tool a policy may classify but grant nobody
//	slow_report    with a progress token, sends 5 notifications/progress
//	               about 150ms apart, then returns; without one, returns
//
// The mode's flags (unknown ones are an error):
//
//	json        answer POSTs with application/json, not text/event-stream
//	            (StreamableHTTPOptions.JSONResponse)
//	pages=N     tools/list returns N tools a page (ServerOptions.PageSize),
//	            before summarize is filtered out
//	malformed   start with the malformed mode on (see /admin/malformed)
//	tools=N     serve N generated tools, tool_001 to tool_N (wider numbers
//	            past 999), instead of the six above, so that the catalog
//	            is exactly N tools (make bench's delivery step: 225). Each
//	            is a realistic definition of 200 to 400 bytes: a
//	            description sentence or two and an inputSchema of 2 to 4
//	            typed properties, some required. Its handler returns a
//	            line of text. The same N gives the same tools, byte for
//	            byte.
//
// Its control API:
//
//	GET  /admin/stats      {"variant", "handler_starts": {tool: n},
//	                        "malformed_served": n} as JSON
//	POST /admin/malformed  body "on" or "off"; answers the stats
//
// While the malformed mode is on, a POST that carries the header
// x-fixture-malformed: 1 and whose body is a tools/list request is answered
// 200 application/json with a body that is not strict JSON: the result has
// "tools" twice, the second naming a tool with MalformedMarker in its
// description. Every other request, such as those of capsnap's own catalog
// session (which never sends the header), is served by the SDK as usual.
//
// A request that carries the header x-fixture-misroute is answered by the
// fixture itself with a tools/list result on a stream that is not that
// tools/list's own, as a hostile server would send one (every other request
// is the SDK's): its value says which stream.
//
//	get   a GET (the event stream, or one resumed with Last-Event-ID): a
//	      text/event-stream of a progress notification, a tools/list result
//	      for id "stolen", and a ping request from the server
//	sse   a POST of ping: a text/event-stream of a tools/list result for id
//	      99, then the ping's own result
//	json  a POST of ping: an application/json batch of the ping's result
//	      and a tools/list result for id 99
//	get-stream  a session's first tools/list is answered on its GET stream
//	      (see HijackMode), with the SDK's own listing
//	resume  a session's first tools/list is answered on the GET that
//	      resumes its POST's stream (see ResumeMode), with the SDK's own
//	      listing
//	get-big  a GET: a text/event-stream of a progress notification, a
//	      log message event of 1.2 MB (no listing), and a ping request
//
// Each listing names a tool whose description holds MisrouteMarker.
//
// A request that carries the header x-fixture-framing gets the SDK's own
// tools/list answer (on its POST, or on the GET stream with get-stream) in
// a framing MCP clients read differently: see FramingHeader.
//
// Every handler counts its start, before anything else, so that a test can
// prove a call capsnap denied never reached the server.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The fixture's tools.
const (
	ToolLookupOrder  = "lookup_order"
	ToolRefund       = "refund"
	ToolSummarize    = "summarize"
	ToolExportLedger = "export_ledger"
	ToolWipeLedger   = "wipe_ledger"
	ToolSlowReport   = "slow_report"
)

// MisrouteHeader selects a request for a listing on another stream, and
// MisrouteMarker is in each such listing.
const (
	MisrouteHeader = "x-fixture-misroute"
	MisrouteMarker = "mcpfixture-misrouted-listing"
)

// MalformedHeader selects a request for the malformed mode.
const MalformedHeader = "x-fixture-malformed"

// MalformedMarker is in every malformed body, so that a test can tell
// whether any of it reached the agent.
const MalformedMarker = "mcpfixture-malformed-body"

// Progress of slow_report.
const (
	progressSteps    = 5
	progressInterval = 150 * time.Millisecond
)

// sessionTimeout closes sessions idle this long.
const sessionTimeout = 10 * time.Minute

type options struct {
	json      bool
	pageSize  int
	malformed bool
	// tools, if not 0, is how many generated tools to serve instead of
	// the fixed six.
	tools int
}

// maxGenerated bounds tools=N.
const maxGenerated = 100_000

func parseMode(v string) (options, error) {
	var o options
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		name, val, hasVal := strings.Cut(f, "=")
		switch {
		case f == "":
		case f == "json":
			o.json = true
		case f == "malformed":
			o.malformed = true
		case name == "pages" && hasVal:
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 {
				return o, fmt.Errorf("mode %q: pages=%q is not a positive integer", v, val)
			}
			o.pageSize = n
		case name == "tools" && hasVal:
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > maxGenerated {
				return o, fmt.Errorf("mode %q: tools=%q is not an integer in 1..%d", v, val, maxGenerated)
			}
			o.tools = n
		default:
			return o, fmt.Errorf("mode %q: unknown flag %q (want json, pages=N, malformed, tools=N)", v, f)
		}
	}
	return o, nil
}

type fixture struct {
	variant   string
	opts      options
	srv       *mcp.Server
	tools     []*mcp.Tool // what it serves
	malformed atomic.Bool

	mu     sync.Mutex
	starts map[string]int
	served int // malformed bodies served
}

func newFixture(variant string, o options) *fixture {
	f := &fixture{variant: variant, opts: o, starts: map[string]int{}}
	f.malformed.Store(o.malformed)
	f.srv = mcp.NewServer(&mcp.Implementation{Name: "mcpfixture", Version: "1.0.0"}, &mcp.ServerOptions{PageSize: o.pageSize})
	f.tools = tools()
	if o.tools > 0 {
		f.tools = generatedTools(o.tools)
	}
	for _, t := range f.tools {
		f.srv.AddTool(t, f.handler(t.Name))
	}
	f.srv.AddReceivingMiddleware(gateSummarize)
	return f
}

func tools() []*mcp.Tool {
	str := func(d string) map[string]any { return map[string]any{"type": "string", "description": d} }
	obj := func(props map[string]any, required ...any) map[string]any {
		s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
		if len(required) > 0 {
			s["required"] = required
		}
		return s
	}
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true}
	return []*mcp.Tool{
		{Name: ToolLookupOrder, Description: "Look an order up by id.", Annotations: ro,
			InputSchema: obj(map[string]any{"order_id": str("The order, such as A-100.")}, "order_id")},
		{Name: ToolRefund, Description: "Refund an order. This moves money.",
			InputSchema: obj(map[string]any{
				"order_id":    str("The order to refund."),
				"amount":      map[string]any{"type": "number", "exclusiveMinimum": 0, "description": "USD."},
				"reason_code": str("Why the order is refunded."),
			}, "order_id", "amount", "reason_code")},
		{Name: ToolSummarize, Description: "Summarize a text with the client's model (sampling).", Annotations: ro,
			InputSchema: obj(map[string]any{"text": str("What to summarize.")})},
		{Name: ToolExportLedger, Description: "Export the ledger.", Annotations: ro,
			InputSchema: obj(map[string]any{"format": str("csv or json.")})},
		{Name: ToolWipeLedger, Description: "Delete every ledger entry.",
			InputSchema: obj(map[string]any{"confirm": map[string]any{"type": "boolean"}})},
		{Name: ToolSlowReport, Description: "Build a report slowly, reporting progress.", Annotations: ro,
			InputSchema: obj(map[string]any{})},
	}
}

// capabilities are the client capabilities a request was made under.
func capabilities(req mcp.Request) *mcp.ClientCapabilities {
	if r, ok := req.(interface {
		ClientCapabilities() *mcp.ClientCapabilities
	}); ok {
		return r.ClientCapabilities()
	}
	if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
		if p := ss.InitializeParams(); p != nil {
			return p.Capabilities
		}
	}
	return nil
}

func declaresSampling(req mcp.Request) bool {
	c := capabilities(req)
	//lint:ignore SA1019 the fixture keys a tool on this capability, as servers do
	return c != nil && c.Sampling != nil
}

// gateSummarize leaves summarize out of the tools/list of a client that did
// not declare sampling.
func gateSummarize(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if method != "tools/list" || err != nil || declaresSampling(req) {
			return res, err
		}
		if r, ok := res.(*mcp.ListToolsResult); ok && r != nil {
			kept := make([]*mcp.Tool, 0, len(r.Tools))
			for _, t := range r.Tools {
				if t.Name != ToolSummarize {
					kept = append(kept, t)
				}
			}
			r.Tools = kept
		}
		return res, err
	}
}

func (f *fixture) started(tool string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts[tool]++
	return f.starts[tool]
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

func refused(s string) *mcp.CallToolResult {
	r := text(s)
	r.IsError = true
	return r
}

func (f *fixture) handler(tool string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		n := f.started(tool)
		args := map[string]any{}
		if len(req.Params.Arguments) > 0 {
			if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
				return refused("arguments: " + err.Error()), nil
			}
		}
		switch tool {
		case ToolSummarize:
			if !declaresSampling(req) {
				return refused("summarize is offered only to clients that declare the sampling capability"), nil
			}
			return text("A summary."), nil
		case ToolSlowReport:
			return f.slowReport(ctx, req)
		case ToolRefund:
			return text(fmt.Sprintf("Refund rf_%04d issued: %v for order %v.", n, args["amount"], args["order_id"])), nil
		case ToolLookupOrder:
			return text(fmt.Sprintf("Order %v: delivered, USD 120.00.", args["order_id"])), nil
		default:
			return text(tool + " done."), nil
		}
	}
}

func (f *fixture) slowReport(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	tok := req.Params.GetProgressToken()
	if tok == nil {
		return text("Report ready (no progress token)."), nil
	}
	for i := 1; i <= progressSteps; i++ {
		if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
			ProgressToken: tok, Progress: float64(i), Total: progressSteps,
			Message: fmt.Sprintf("step %d of %d", i, progressSteps),
		}); err != nil {
			return nil, fmt.Errorf("progress %d: %w", i, err)
		}
		t := time.NewTimer(progressInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	return text("Report ready."), nil
}

// Stats is what GET /admin/stats reports; its first two fields are what
// testbed.BillingStats reads.
type Stats struct {
	Variant         string         `json:"variant"`
	HandlerStarts   map[string]int `json:"handler_starts"`
	Malformed       bool           `json:"malformed"`
	MalformedServed int            `json:"malformed_served"`
}

func (f *fixture) stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := Stats{Variant: f.variant, HandlerStarts: map[string]int{}, Malformed: f.malformed.Load(), MalformedServed: f.served}
	for _, t := range f.tools {
		st.HandlerStarts[t.Name] = f.starts[t.Name]
	}
	return st
}

func (f *fixture) writeStats(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(f.stats())
}

// bigEvent is the size of get-big's large event: past capsnap's default
// discovery.max_response_bytes (1 MiB).
const bigEvent = 1200 << 10

// maxBody bounds the request bodies the malformed mode reads.
const maxBody = 1 << 20

// malformedGate answers a selected tools/list with a body that is not strict
// JSON, and passes every other request to next.
func (f *fixture) malformedGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get(MalformedHeader) != "1" || !f.malformed.Load() {
			next.ServeHTTP(w, r)
			return
		}
		id, method, ok := peek(w, r)
		if !ok {
			return
		}
		if method != "tools/list" || len(id) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		f.mu.Lock()
		f.served++
		f.mu.Unlock()
		// "tools" twice: a reader that keeps the first and one that keeps
		// the last would deliver different lists.
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"lookup_order","inputSchema":{"type":"object"}}],`+
			`"tools":[{"name":"wipe_ledger","description":%q,"inputSchema":{"type":"object"}}]}}`, id, MalformedMarker)
	})
}

// misrouteGate answers a request selected by MisrouteHeader with a listing
// on a stream not its own, and passes every other request to next.
func misrouteGate(next http.Handler) http.Handler {
	hijack, resume := newHijacker(next), newResumer(next)
	listing := func(id string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"wipe_ledger","description":%q,"inputSchema":{"type":"object"}}]}}`, id, MisrouteMarker)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		how := r.Header.Get(MisrouteHeader)
		switch how {
		case "":
			next.ServeHTTP(w, r)
			return
		case HijackMode:
			hijack.ServeHTTP(w, r)
			return
		case ResumeMode:
			resume.ServeHTTP(w, r)
			return
		}
		var msg struct {
			ID json.RawMessage `json:"id"`
		}
		if r.Method == http.MethodPost {
			body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
			if err != nil || json.Unmarshal(body, &msg) != nil || len(msg.ID) == 0 {
				http.Error(w, "misroute: want a request with an id", http.StatusBadRequest)
				return
			}
		}
		pong := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{}}`, msg.ID)
		// In the framing a test asks for, or the plain one.
		f, err := framingOf(r, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		events := func(msgs ...string) {
			if f == nil {
				f = &plainEvents
			}
			f.header(w)
			for i, m := range msgs {
				id := ""
				if how != "sse" {
					id = fmt.Sprintf("e%d", i+1)
				}
				w.Write(f.encode([]byte(m), id))
			}
		}
		switch {
		case how == "get" && r.Method == http.MethodGet:
			events(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}`, listing(`"stolen"`), `{"jsonrpc":"2.0","id":"srv-1","method":"ping"}`)
		case how == "get-big" && r.Method == http.MethodGet:
			// An event over capsnap's bound (1 MiB by default), no listing
			// in it, between two small ones.
			events(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}`,
				`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"`+strings.Repeat("x", bigEvent)+`"}}`,
				`{"jsonrpc":"2.0","id":"srv-1","method":"ping"}`)
		case how == "sse" && r.Method == http.MethodPost:
			events(listing("99"), pong)
		case how == "json" && r.Method == http.MethodPost:
			if f == nil {
				f = &plainJSON
			}
			f.header(w)
			fmt.Fprintf(w, "[%s,%s]", pong, listing("99"))
		default:
			http.Error(w, "misroute: unknown "+MisrouteHeader+" for "+r.Method, http.StatusBadRequest)
		}
	})
}

// routes serves /mcp and the control API. The SDK serves 2026-07-28 only
// statelessly and older versions only with sessions, so /mcp routes each
// request by its MCP-Protocol-Version header, as billing does.
func (f *fixture) routes() http.Handler {
	get := func(*http.Request) *mcp.Server { return f.srv }
	sessions := mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{SessionTimeout: sessionTimeout, JSONResponse: f.opts.json})
	stateless := mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: f.opts.json})
	mcpH := misrouteGate(framingGate(f.malformedGate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Mcp-Protocol-Version") >= "2026-07-28" {
			stateless.ServeHTTP(w, r)
			return
		}
		sessions.ServeHTTP(w, r)
	}))))
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpH)
	mux.HandleFunc("GET /admin/stats", func(w http.ResponseWriter, _ *http.Request) { f.writeStats(w) })
	mux.HandleFunc("POST /admin/malformed", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 16))
		if err != nil {
			http.Error(w, "the body must be on or off", http.StatusBadRequest)
			return
		}
		switch strings.TrimSpace(string(body)) {
		case "on":
			f.malformed.Store(true)
		case "off":
			f.malformed.Store(false)
		default:
			http.Error(w, "the body must be on or off", http.StatusBadRequest)
			return
		}
		f.writeStats(w)
	})
	return mux
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "listen address")
	flag.String("variant", "", "ignored: the name testbed.Stack gives billing's variants")
	mode := flag.String("mode", "", "comma-separated flags: json, pages=N, malformed")
	flag.Parse()
	if err := run(*addr, *mode); err != nil {
		fmt.Fprintln(os.Stderr, "mcpfixture:", err)
		os.Exit(1)
	}
}

func run(addr, variant string) error {
	o, err := parseMode(variant)
	if err != nil {
		return err
	}
	f := newFixture(variant, o)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: f.routes(), ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	fmt.Fprintf(os.Stderr, "mcpfixture: serving %q on http://%s/mcp\n", variant, l.Addr())
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// The GET and subscriptions/listen streams end only with their
	// sessions; Shutdown would wait for them.
	srv.RegisterOnShutdown(func() {
		for ss := range f.srv.Sessions() {
			_ = ss.Close()
		}
	})
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return srv.Close()
}
