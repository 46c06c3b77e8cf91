package store_test

import (
	"testing"

	"github.com/capsnap/capsnap/store"
	"github.com/capsnap/capsnap/store/storetest"
)

func TestMemoryKeepsTheStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) storetest.Store {
		o := store.MemoryOptions{MaxSnapshots: 1000, ApprovalsKept: storetest.Retain}
		if clock != nil {
			o.Now = clock.Now
		}
		m, err := store.NewMemory(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		return m
	})
}
