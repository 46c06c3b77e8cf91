package catalog_test

// Fault tests at the catalog level (issue 6, item 5), against a real Go SDK
// server on loopback: a slow tools/list and a catalog of 10,000 tools.
// docs/FAULTS.md names them. The upstream down at start is
// TestMCPSourceServerDownAtStart, going away TestMCPSourceServerGoesAway,
// and a list_changed storm TestSDKListChangedStorm. No assertion is on a
// duration: figures are printed.

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsnap/capsnap/catalog"
)

// TestFaultSlowToolsList: a server whose tools/list becomes slower than the
// source's Timeout. Each fetch is cut at the Timeout and fails; Lookup keeps
// returning the last good list (same generation, same FetchedAt, so its age
// grows) with the error in Status; once the server is fast again the list
// is confirmed afresh.
//
// On the session versions the failure is published only after the SDK's
// ClientSession.Close returns, which waits up to its 5 s DELETE timeout
// while the server is still busy with the stalled list (see FAULTS.md);
// the figures printed show it.
func TestFaultSlowToolsList(t *testing.T) {
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			slowToolsList(t, version)
		})
	}
}

func slowToolsList(t *testing.T, version string) {
	const timeout = 300 * time.Millisecond
	var delay atomic.Int64
	s := newSDKServer(t, nil, 0, simpleTool("refund", "Refund an order."))
	s.srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if d := time.Duration(delay.Load()); method == "tools/list" && d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return next(ctx, method, req)
		}
	})
	src := mcpSource(s.url(), version, 100*time.Millisecond)
	src.Timeout = timeout
	c, changes := runCatalog(t, src)
	awaitChange(t, changes, "initial sync")
	good, st, err := c.Lookup("s")
	if err != nil || st.LastError != nil {
		t.Fatalf("Lookup after the first list: %+v, %v", st, err)
	}
	fetched := st.FetchedAt

	delay.Store(int64(5 * time.Second))
	slowSince := time.Now()
	waitFor(t, "a failed fetch", func() bool {
		_, st, _ := c.Lookup("s")
		return st.LastError != nil
	})
	list, st, err := c.Lookup("s")
	if err != nil || list != good || !st.FetchedAt.Equal(fetched) || !st.Synced {
		t.Fatalf("Lookup while tools/list is slow: list kept %v, %+v, %v; want the last good list", list == good, st, err)
	}
	firstFail := st.LastAttempt
	t.Logf("slow tools/list: first fetch failed %v after the slowdown began: %v", time.Since(slowSince).Round(time.Millisecond), st.LastError)
	// Let a few more bounded attempts fail; the list still stands.
	waitFor(t, "another failed fetch", func() bool {
		_, st, _ := c.Lookup("s")
		return st.LastError != nil && st.LastAttempt.After(firstFail.Add(timeout))
	})
	list, st, _ = c.Lookup("s")
	if list != good || !st.FetchedAt.Equal(fetched) {
		t.Fatal("a failed fetch replaced or re-dated the list")
	}
	t.Logf("after more failed fetches: list age %v, last attempt %v ago, generation %d",
		time.Since(st.FetchedAt).Round(time.Millisecond), time.Since(st.LastAttempt).Round(time.Millisecond), list.Generation)

	delay.Store(0)
	waitFor(t, "a fresh fetch", func() bool {
		_, st, _ := c.Lookup("s")
		return st.LastError == nil && st.FetchedAt.After(fetched)
	})
	list, _, _ = c.Lookup("s")
	if list.Generation != good.Generation {
		t.Errorf("generation %d after the slowdown, want %d kept (same content)", list.Generation, good.Generation)
	}
}

// TestFaultTenThousandTools: a server of 10,000 tools, listed in pages of
// 500. The catalog syncs all of them, every digest as the server defines
// it; the time and heap it took are printed.
// bigBound bounds each wait on the 10,000-tool catalog: generous, since
// under -race on a shared 2-core machine one listing took 5 s.
const bigBound = 60 * time.Second

func TestFaultTenThousandTools(t *testing.T) {
	const n = 10000
	tools := make([]*mcp.Tool, n)
	for i := range tools {
		tools[i] = simpleTool(fmt.Sprintf("tool_%05d", i), fmt.Sprintf("Tool number %d of the large catalog.", i))
	}
	s := newSDKServer(t, &mcp.ServerOptions{PageSize: 500}, 0, tools...)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	src := mcpSource(s.url(), "2025-11-25", time.Hour)
	src.Timeout = 60 * time.Second
	c, changes := runCatalog(t, src)
	var ch onChange
	select {
	case ch = <-changes:
	case <-time.After(bigBound):
		t.Fatalf("10,000 tools not synced within %v", bigBound)
	}
	took := time.Since(t0)
	list, st, err := c.Lookup("s")
	if err != nil || st.LastError != nil || list != ch.next {
		t.Fatalf("Lookup: %+v, %v", st, err)
	}
	if len(list.Tools) != n || len(ch.changed) != n {
		t.Fatalf("%d tools listed, %d changed; want %d", len(list.Tools), len(ch.changed), n)
	}
	for _, i := range []int{0, 1, 499, 500, 4999, 9999} {
		name := tools[i].Name
		if got, want := list.Tools[name].Digest, wantDigest(t, tools[i]); got != want {
			t.Errorf("%s: digest %s, want %s", name, got, want)
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	t.Logf("10,000 tools in %d tools/list requests: synced in %v; live heap %.1f MiB -> %.1f MiB (server and catalog in one process)",
		s.lists.Load(), took.Round(time.Millisecond), float64(before.HeapAlloc)/(1<<20), float64(after.HeapAlloc)/(1<<20))
	if s.lists.Load() < n/500 {
		t.Errorf("%d tools/list requests, want at least %d pages", s.lists.Load(), n/500)
	}
	runtime.KeepAlive(list)

	// A relist of the same 10,000 keeps the generation.
	lists := s.lists.Load()
	t1 := time.Now()
	s.srv.AddTool(tools[0], nop) // the SDK notifies list_changed
	for end := time.Now().Add(bigBound); ; time.Sleep(10 * time.Millisecond) {
		if _, st, _ := c.Lookup("s"); s.lists.Load() >= lists+n/500 && st.FetchedAt.After(t1) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("10,000 tools not relisted within %v", bigBound)
		}
	}
	t.Logf("relist of the same 10,000 tools after list_changed: %v", time.Since(t1).Round(time.Millisecond))
	if l, _, _ := c.Lookup("s"); l.Generation != list.Generation {
		t.Errorf("generation %d after an identical relist, want %d", l.Generation, list.Generation)
	}
}

var _ catalog.Source = (*catalog.MCPSource)(nil)
