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

	"github.com/capsnap/capsnap/examples/billing"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "listen address")
	variant := flag.String("variant", billing.Baseline, "contract to start with: "+strings.Join(billing.Variants(), ", "))
	pin := flag.Bool("pin", true, "refuse, at handler start, calls whose capsnap pin is not the handler's own digest")
	flag.Parse()
	if err := run(*addr, *variant, *pin); err != nil {
		fmt.Fprintln(os.Stderr, "billing:", err)
		os.Exit(1)
	}
}

func run(addr, variant string, pin bool) error {
	b := billing.New(billing.Options{Pin: pin})
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
	fmt.Fprintf(os.Stderr, "billing: serving %s on http://%s/mcp (pin=%v)\n", variant, l.Addr(), pin)
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
