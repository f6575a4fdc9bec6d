package store_test

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/gateway/store/storetest"
)

// TestTimedSuite: the shared suite passes through Timed unchanged, and
// each operation it makes is observed under its method's name.
func TestTimedSuite(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	observe := func(op string, d time.Duration) {
		mu.Lock()
		seen[op]++
		mu.Unlock()
	}
	storetest.Run(t, func(t testing.TB) (store.Store, func() store.Store) {
		p := filepath.Join(t.TempDir(), "bcgw.db")
		s, err := store.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		var last store.Store = s
		t.Cleanup(func() { last.Close() })
		return store.Timed(s, observe), func() store.Store {
			s, err := store.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			last = s
			return store.Timed(s, observe)
		}
	})
	for _, op := range []string{"AddCommand", "SetResult", "SpendToken", "PutSpec", "AddEvent", "Meta"} {
		if seen[op] == 0 {
			t.Errorf("no %s observed (%v)", op, seen)
		}
	}
}

// fakeShared is a store that is also Shared and Releases, for the type
// assertions the gateway makes; it is never called.
type fakeShared struct {
	store.Store
	store.Shared
	store.Releases
}

// TestTimedKeepsInterfaces: what the store also is (Shared, Releases),
// the timed store is too, and nothing more.
func TestTimedKeepsInterfaces(t *testing.T) {
	b, _ := open(t)
	nop := func(string, time.Duration) {}
	tb := store.Timed(b, nop)
	if _, ok := tb.(store.Shared); ok {
		t.Error("a timed bbolt store is Shared")
	}
	if _, ok := tb.(store.Releases); ok {
		t.Error("a timed bbolt store has Releases")
	}
	ts := store.Timed(fakeShared{Store: b}, nop)
	if _, ok := ts.(store.Shared); !ok {
		t.Error("a timed shared store is not Shared")
	}
	if _, ok := ts.(store.Releases); !ok {
		t.Error("a timed store with releases has none")
	}
}
