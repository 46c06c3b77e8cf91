// Command billing serves the billing example MCP server over streamable
// HTTP, with its control API for the demo and the end-to-end tests.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/capsnap/capsnap/examples/billing"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "listen address")
	variant := flag.String("variant", billing.Baseline, "contract to start with")
	pin := flag.Bool("pin", true, "refuse calls whose capsnap pin is not the handler's own digest")
	flag.Parse()
	if err := run(*addr, *variant, *pin); err != nil {
		fmt.Fprintln(os.Stderr, "billing:", err)
		os.Exit(1)
	}
}

func run(addr, variant string, pin bool) error {
	b, err := billing.New(billing.Options{Variant: variant, Pin: pin})
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: addr, Handler: b.Handler(), ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	fmt.Fprintf(os.Stderr, "billing: serving %s on %s/mcp\n", variant, addr)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
