package cache_test

import (
	"testing"

	"github.com/capsnap/capsnap/cache"
	"github.com/capsnap/capsnap/cache/countertest"
	"github.com/capsnap/capsnap/cache/storetest"
	"github.com/capsnap/capsnap/policy"
)

func TestMemoryKeepsTheStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Store {
		m, err := cache.NewMemory(cache.MemoryOptions{MaxSnapshots: 1000})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		return m
	})
}

func TestMemoryKeepsTheCounterContract(t *testing.T) {
	countertest.Run(t, func(t *testing.T, clock *countertest.Clock) policy.Counters {
		m, err := cache.NewMemory(cache.MemoryOptions{MaxSnapshots: 1000, Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		return m
	})
}
