package store_test

import (
	"testing"

	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/countertest"
	"github.com/capsnap/capsnap/store/storetest"
)

func TestMemoryKeepsTheStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Store {
		m, err := store.NewMemory(store.MemoryOptions{MaxSnapshots: 1000})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		return m
	})
}

func TestMemoryKeepsTheCounterContract(t *testing.T) {
	countertest.Run(t, func(t *testing.T, clock *countertest.Clock) policy.Counters {
		m, err := store.NewMemory(store.MemoryOptions{MaxSnapshots: 1000, Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		return m
	})
}
