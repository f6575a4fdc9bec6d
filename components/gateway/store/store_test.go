package store_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/gateway/store/storetest"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func open(t *testing.T) (*store.Bolt, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bcgw.db")
	s, err := store.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, p
}

func TestOpenFileMode(t *testing.T) {
	_, p := open(t)
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("database mode %04o, want 0600", st.Mode().Perm())
	}
}

func TestHashSecret(t *testing.T) {
	// SHA-256 of "abc".
	if got := store.HashSecret("abc"); got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatalf("HashSecret(abc) = %s", got)
	}
}

// The shared suite on the bbolt store; reopen opens the same file.
func TestSuite(t *testing.T) {
	storetest.Run(t, func(t testing.TB) (store.Store, func() store.Store) {
		p := filepath.Join(t.TempDir(), "bcgw.db")
		s, err := store.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		var last store.Store = s
		t.Cleanup(func() { last.Close() })
		return s, func() store.Store {
			s, err := store.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			last = s
			return s
		}
	})
}

// BenchmarkStore: the shared benchmarks on bbolt (each write fsynced).
func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, func(t testing.TB) (store.Store, func() store.Store) {
		s, err := store.Open(filepath.Join(t.TempDir(), "bcgw.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s, nil
	})
}
