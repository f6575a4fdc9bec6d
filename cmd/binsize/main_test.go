package main

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
)

func TestPkgOf(t *testing.T) {
	for sym, want := range map[string]string{
		"runtime.mallocgc": "runtime",
		"github.com/google/go-tpm/tpm2.(*TPM2B).Unmarshal": "github.com/google/go-tpm/tpm2",
		"type:*encoding/json.decodeState":                  "encoding/json",
		"go:func.*":                                        "go: (runtime tables)",
		"crypto/internal/fips140/nistec/fiat.p521Mul":      "crypto/internal/fips140/nistec/fiat",
		"vendor/golang.org/x/net/dns/dnsmessage.init":      "vendor/golang.org/x/net/dns/dnsmessage",
	} {
		if got := pkgOf(sym); got != want {
			t.Errorf("pkgOf(%q) = %q, want %q", sym, got, want)
		}
	}
}

// TestMeasure reads the symbols of binsize itself, built unstripped:
// encoding/json is in it, bss is left out, and the sizes add up to no
// more than the file; the stripped build has no symbols to read.
func TestMeasure(t *testing.T) {
	goBin := testenv.NeedTool(t, "go", "golang-go")
	exe, stripped := filepath.Join(t.TempDir(), "binsize"), filepath.Join(t.TempDir(), "binsize-stripped")
	for _, c := range [][]string{{"build", "-o", exe, "."}, {"build", "-ldflags=-s -w", "-o", stripped, "."}} {
		if out, err := exec.Command(goBin, c...).CombinedOutput(); err != nil {
			t.Fatalf("go %v: %v\n%s", c, err, out)
		}
	}
	if _, err := measure(stripped, "", 10); err == nil {
		t.Error("a stripped binary measured")
	}
	r, err := measure(exe, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	seen := false
	var sum int64
	for _, p := range r.Top {
		sum += p.Bytes
		seen = seen || p.Path == "encoding/json"
	}
	if !seen || sum != r.Symbols || r.Symbols > r.Bytes {
		t.Fatalf("encoding/json listed %v; symbols %d (summed %d), file %d", seen, r.Symbols, sum, r.Bytes)
	}
}
