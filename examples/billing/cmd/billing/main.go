// Command billing serves the billing example MCP server over streamable
// HTTP, with its control API, for the demo and the end-to-end tests.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/examples/billing"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "listen address")
	variant := flag.String("variant", billing.Baseline, "contract to start with: "+strings.Join(billing.Variants(), ", "))
	pin := flag.Bool("pin", true, "refuse, at handler start, calls whose capsnap pin is not the handler's own digest")
	jwks := flag.String("jwks", "", "with -pin, check capsnap's signed envelope against this JWKS (a file, or an http(s) URL such as capsnap's /.well-known/jwks.json) instead of the plain pin header")
	serverID := flag.String("server-id", "billing", "this server's server_id: the audience its envelopes must name")
	var grantKeys stringList
	flag.Var(&grantKeys, "grant-key", "with -jwks, a grant key (P-256 private key, PEM PKCS #8) to open envelopes under a grant with; repeat during a rotation")
	flag.Parse()
	opts := billing.Options{Pin: *pin}
	if *jwks != "" {
		o := envelope.VerifierOptions{Audience: *serverID, GrantKeyFiles: grantKeys}
		if strings.HasPrefix(*jwks, "http://") || strings.HasPrefix(*jwks, "https://") {
			o.JWKSURL = *jwks
		} else {
			o.JWKSFile = *jwks
		}
		v, err := envelope.NewVerifier(o)
		if err != nil {
			fmt.Fprintln(os.Stderr, "billing:", err)
			os.Exit(1)
		}
		opts.Envelope = v
	}
	if err := run(*addr, *variant, opts); err != nil {
		fmt.Fprintln(os.Stderr, "billing:", err)
		os.Exit(1)
	}
}

func run(addr, variant string, opts billing.Options) error {
	b := billing.New(opts)
	if err := b.SetVariant(variant); err != nil {
		return err
	}
	// Listening before serving makes a taken port an error here rather than
	// in a goroutine, and the address printed below a real one.
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: b.Handler(), ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	fmt.Fprintf(os.Stderr, "billing: serving %s on http://%s/mcp (pin=%v, envelope=%v)\n", variant, l.Addr(), opts.Pin, opts.Envelope != nil)
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// Shutdown waits for every request to end, and the list_changed
	// streams end only with their sessions.
	srv.RegisterOnShutdown(func() {
		for ss := range b.Server().Sessions() {
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

// stringList is a flag that may be given several times.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }
