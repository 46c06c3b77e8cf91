// Command checkload is make bench's load on an ext_authz server: it sends
// one CheckRequest (protojson, -data) to the server at its address a fixed
// number of times, a fixed number at a time on one connection, and writes
// what it measured as JSON on stdout (package grpcload).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/capsnap/capsnap/bench/grpcload"
)

func main() {
	data := flag.String("data", "", "the CheckRequest, as protojson")
	concurrency := flag.Int("concurrency", 1, "requests in flight")
	total := flag.Int("total", 1000, "requests in all")
	timeout := flag.Duration("timeout", grpcload.Timeout, "each request's timeout")
	flag.Parse()
	if err := run(*data, flag.Arg(0), *concurrency, *total, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "checkload:", err)
		os.Exit(1)
	}
}

func run(data, target string, concurrency, total int, timeout time.Duration) error {
	if flag.NArg() != 1 || concurrency < 1 || total < 1 {
		return fmt.Errorf("usage: checkload -data FILE [-concurrency N] [-total N] HOST:PORT")
	}
	b, err := os.ReadFile(data)
	if err != nil {
		return err
	}
	req := &authv3.CheckRequest{}
	if err := protojson.Unmarshal(b, req); err != nil {
		return fmt.Errorf("%s: %w", data, err)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r := grpcload.Generate(ctx, authv3.NewAuthorizationClient(conn), req, concurrency, total, timeout)
	if err := ctx.Err(); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}
