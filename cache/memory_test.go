package cache_test

import (
	"testing"

	"github.com/capsnap/capsnap/cache"
	"github.com/capsnap/capsnap/cache/storetest"
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
