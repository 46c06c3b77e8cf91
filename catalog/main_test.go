package catalog

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the run if any test leaves a goroutine behind: every source
// must stop when its context ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// wait bounds every wait on the catalog.
const wait = 10 * time.Second

// change is one OnChange call.
type change struct {
	prev, next *List
	changed    []string
}

// observed passes its source's fetches on to the catalog and then reports
// each one's error, so that tests wait for a fetch instead of sleeping.
type observed struct {
	Source
	attempts chan error
}

func (o observed) Run(ctx context.Context, publish Publish) error {
	return o.Source.Run(ctx, func(defs []json.RawMessage, err error) {
		publish(defs, err)
		select {
		case o.attempts <- err:
		default: // nobody is waiting for this many; drop it
		}
	})
}

// watch runs a catalog of the one server "up" until the test ends.
func watch(t *testing.T, src Source) (*Catalog, <-chan change, <-chan error) {
	t.Helper()
	changes := make(chan change, 64)
	attempts := make(chan error, 64)
	c := New(map[string]Source{"up": observed{src, attempts}}, Options{
		OnChange: func(_ string, prev, next *List, changed []string) { changes <- change{prev, next, changed} },
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(wait):
			t.Errorf("Run did not return within %v of its context ending", wait)
		}
	})
	return c, changes, attempts
}

func nextChange(t *testing.T, changes <-chan change) change {
	t.Helper()
	select {
	case ch := <-changes:
		return ch
	case <-time.After(wait):
		t.Fatalf("no catalog change within %v", wait)
		return change{}
	}
}

// nextAttempt waits for a fetch whose outcome is failed (or not).
func nextAttempt(t *testing.T, attempts <-chan error, failed bool) error {
	t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case err := <-attempts:
			if (err != nil) == failed {
				return err
			}
		case <-timeout:
			t.Fatalf("no fetch with failed=%v within %v", failed, wait)
			return nil
		}
	}
}
