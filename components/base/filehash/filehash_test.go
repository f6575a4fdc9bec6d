package filehash

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSHA256(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	// SHA-256("abc"), FIPS 180-2 appendix B.1.
	const want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got, err := SHA256(p); err != nil || got != want {
		t.Fatalf("SHA256 = %s %v, want %s", got, err, want)
	}
	if _, err := SHA256(filepath.Join(t.TempDir(), "missing")); !os.IsNotExist(err) {
		t.Fatalf("a missing file: %v", err)
	}
	if _, err := Reader(failing{}, "the pipe"); err == nil || !strings.Contains(err.Error(), "read the pipe") {
		t.Fatalf("a failing reader: %v", err)
	}
}

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, os.ErrClosed }
