package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/catalog"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/lockfile"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
)

// defaultLockfile is the lockfile's name beside the config when the policy
// names none.
const defaultLockfile = "capsnap.lock"

// lockOptions are lock's flags: out is "" for the default lockfile, admin
// "" for the config's admin_addr.
type lockOptions struct {
	config, out, admin string
	check, approved    bool
	timeout            time.Duration
}

// lock writes the approvals lockfile from the live servers (as capsnap
// itself sees them, through the same sources serve uses), or with --check
// compares the live servers with it, exiting 1 with the differences.
func lock(o lockOptions, stdout io.Writer) error {
	if o.config == "" {
		return usageError{"lock: --config FILE is required"}
	}
	if o.timeout <= 0 {
		return usageError{fmt.Sprintf("lock: --timeout %s is not positive", o.timeout)}
	}
	cfg, err := config.Load(o.config)
	if err != nil {
		return err
	}
	path := o.out
	if path == "" {
		// The policy only says where the lockfile is; it is not loaded
		// with it, so that the first lock can run before the file exists.
		p, err := policy.Load(cfg.PolicyFile)
		if err != nil {
			return err
		}
		if path = p.Lockfile(); path == "" {
			path = filepath.Join(filepath.Dir(o.config), defaultLockfile)
		}
	}

	var locked *lockfile.Lock
	if o.check {
		// Before asking any server: a missing lockfile needs no wait.
		if locked, err = lockfile.Load(path); err != nil {
			return err
		}
	}

	ctx, stop := signalContext()
	defer stop()
	var live []lockfile.Entry
	if o.approved {
		if o.admin == "" {
			o.admin = loopbackIfUnspecified(cfg.AdminAddr)
		}
		live, err = approvedTools(ctx, o.admin, o.timeout, stdout)
	} else {
		live, err = liveTools(ctx, cfg, o.timeout)
	}
	if err != nil {
		return err
	}
	if !o.check {
		if err := lockfile.Write(path, live); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s: %s from %s\n", path, countOf(len(live), "tool"), countOf(len(cfg.Servers), "server"))
		// What the lock approves runs under the policy's limits and
		// approvals, which reviewers of the lockfile should see beside it.
		if p, err := policy.Load(cfg.PolicyFile); err == nil {
			for _, e := range live {
				for _, r := range p.SpanningRules(e.ServerID, e.Tool) {
					fmt.Fprintf(stdout, "  %s/%s: %s\n", e.ServerID, e.Tool, r)
				}
			}
		}
		return nil
	}
	changes := lockfile.Diff(locked.Entries(), live)
	if len(changes) == 0 {
		fmt.Fprintf(stdout, "lockfile up to date: %s approves the %s live\n", path, countOf(len(live), "tool"))
		return nil
	}
	for _, c := range changes {
		fmt.Fprintln(stdout, c)
	}
	return fmt.Errorf("lock --check: %s does not match the live tools (%s); review them and run capsnap lock", path, countOf(len(changes), "change"))
}

// approvedTools asks the running capsnap at admin (GET /definitions) for
// the definitions change control has approved: the lockfile as the
// GitOps form of what reviewers and the policy approved. A live tool
// under change control with none approved is left out, and said.
func approvedTools(ctx context.Context, admin string, timeout time.Duration, stdout io.Writer) ([]lockfile.Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/definitions", nil)
	if err != nil {
		return nil, fmt.Errorf("lock --approved: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("lock --approved: ask capsnap at %s: %w", admin, err)
	}
	defer resp.Body.Close()
	var defs map[string]map[string]store.ToolState
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("lock --approved: capsnap at %s answered %s", admin, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&defs); err != nil {
		return nil, fmt.Errorf("lock --approved: capsnap at %s: %w", admin, err)
	}
	var entries []lockfile.Entry
	for _, id := range slices.Sorted(maps.Keys(defs)) {
		for _, tool := range slices.Sorted(maps.Keys(defs[id])) {
			a := defs[id][tool].Approved
			if a == nil {
				fmt.Fprintf(stdout, "  %s/%s: no definition approved yet, left out\n", id, tool)
				continue
			}
			entries = append(entries, lockfile.Entry{ServerID: id, Tool: tool, Digest: a.Digest, Definition: a.Definition})
		}
	}
	return entries, nil
}

// countOf is "1 tool", "2 tools".
func countOf(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// liveTools runs the catalog until every server has listed its tools once,
// then stops it and returns every tool. It gives up after timeout, naming
// each server that has not listed and why.
func liveTools(ctx context.Context, cfg config.Config, timeout time.Duration) ([]lockfile.Entry, error) {
	lists, err := liveLists(ctx, cfg, timeout)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	var entries []lockfile.Entry
	for _, id := range slices.Sorted(maps.Keys(lists)) {
		for _, t := range lists[id].Tools {
			entries = append(entries, lockfile.Entry{ServerID: id, Tool: t.Name, Digest: t.Digest, Definition: t.Definition})
		}
	}
	return entries, nil
}

// liveLists lists every server of cfg through the sources serve uses, as
// capsnap itself sees them, waiting at most timeout for all to answer.
func liveLists(ctx context.Context, cfg config.Config, timeout time.Duration) (map[string]*catalog.List, error) {
	srcs, err := sources(cfg, zerolog.Nop(), nil)
	if err != nil {
		return nil, err
	}
	var (
		mu      sync.Mutex
		pending = make(map[string]bool, len(srcs))
		synced  = make(chan struct{})
	)
	for id := range srcs {
		pending[id] = true
	}
	cat := catalog.New(srcs, catalog.Options{OnChange: func(id string, _, _ *catalog.List, _ []string) {
		mu.Lock()
		defer mu.Unlock()
		if pending[id] {
			delete(pending, id)
			if len(pending) == 0 {
				close(synced)
			}
		}
	}})

	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cat.Run(rctx) }()
	var runErr error
	select {
	case <-synced:
		cancel()
		runErr = <-done
	case <-rctx.Done():
		runErr = <-done
	case runErr = <-done:
	}
	if runErr != nil {
		return nil, runErr
	}

	lists := map[string]*catalog.List{}
	var unsynced []string
	for _, id := range cat.Servers() {
		list, st, err := cat.Lookup(id)
		if err != nil {
			msg := fmt.Sprintf("server %q did not list its tools within %s", id, timeout)
			if st.LastError != nil {
				msg += ": " + st.LastError.Error()
			}
			unsynced = append(unsynced, msg)
			continue
		}
		lists[id] = list
	}
	switch {
	case len(unsynced) == 0:
		return lists, nil
	case ctx.Err() != nil:
		return nil, errors.New("interrupted")
	default:
		return nil, errors.New(strings.Join(unsynced, "; "))
	}
}
