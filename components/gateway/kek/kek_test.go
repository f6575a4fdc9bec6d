package kek

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGenerateParseRoundTrip(t *testing.T) {
	k, file, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(file, []byte(fileHeader)) || !bytes.HasSuffix(file, []byte("\n")) || bytes.Count(file, []byte("\n")) != 1 {
		t.Fatalf("file %q", file)
	}
	k2, err := Parse(file)
	if err != nil {
		t.Fatal(err)
	}
	if k.Fingerprint() != k2.Fingerprint() || !strings.HasPrefix(k.Fingerprint(), "sha256:") || len(k.Fingerprint()) != 7+32 {
		t.Fatalf("fingerprints %s %s", k.Fingerprint(), k2.Fingerprint())
	}
	blob, err := k.Seal("node-ca.key", 1, []byte("secret key"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := k2.Open("node-ca.key", 1, blob); err != nil || string(got) != "secret key" {
		t.Fatalf("open: %q %v", got, err)
	}
	k3, _, _ := Generate()
	if k3.Fingerprint() == k.Fingerprint() {
		t.Fatal("two KEKs, one fingerprint")
	}
	// Printed by mistake, a KEK shows its fingerprint only.
	key := strings.TrimSpace(strings.TrimPrefix(string(file), fileHeader))
	for _, s := range []string{fmt.Sprint(k), fmt.Sprintf("%v %+v %#v %s", k, k, k, k)} {
		if strings.Contains(s, key) || !strings.Contains(s, k.Fingerprint()) {
			t.Errorf("printed: %s", s)
		}
	}
}

// A blob opens only under its KEK, for its name and version, unchanged.
func TestOpenRefuses(t *testing.T) {
	k, _, _ := Generate()
	other, _, _ := Generate()
	blob, err := k.Seal("join-signing.key", 1, []byte("-----BEGIN PRIVATE KEY-----"))
	if err != nil {
		t.Fatal(err)
	}
	flip := func(i int) []byte { b := bytes.Clone(blob); b[i] ^= 1; return b }
	for _, tc := range []struct {
		name    string
		k       *KEK
		key     string
		version uint32
		blob    []byte
		want    error
	}{
		{"another KEK", other, "join-signing.key", 1, blob, ErrNotOpened},
		{"another name", k, "workload-signing.key", 1, blob, ErrNotOpened},
		{"another version", k, "join-signing.key", 2, blob, ErrNotOpened},
		{"nonce changed", k, "join-signing.key", 1, flip(3), ErrNotOpened},
		{"ciphertext changed", k, "join-signing.key", 1, flip(1 + nonceSize + 2), ErrNotOpened},
		{"tag changed", k, "join-signing.key", 1, flip(len(blob) - 1), ErrNotOpened},
		{"format changed", k, "join-signing.key", 1, flip(0), ErrMalformed},
		{"truncated", k, "join-signing.key", 1, blob[:1+nonceSize+tagSize-1], ErrMalformed},
		{"empty", k, "join-signing.key", 1, nil, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.k.Open(tc.key, tc.version, tc.blob)
			if !errors.Is(err, tc.want) || got != nil {
				t.Fatalf("open: %q %v, want %v", got, err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.key) {
				t.Errorf("error %q does not name the key", err)
			}
			if strings.Contains(err.Error(), "BEGIN") {
				t.Errorf("error %q holds the plaintext", err)
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	_, good, _ := Generate()
	key := strings.TrimSpace(strings.TrimPrefix(string(good), fileHeader))
	for _, tc := range []struct{ name, in string }{
		{"empty", ""},
		{"no header", key + "\n"},
		{"other header", "bcgw-kek-v2:" + key},
		{"short", fileHeader + key[:len(key)-1]},
		{"long", fileHeader + key + "A"},
		{"padded", fileHeader + key[:len(key)-1] + "="},
		{"not base64url", fileHeader + strings.Repeat("+", len(key))},
		{"two lines", fileHeader + key + "\n\n"},
		{"space", fileHeader + " " + key[1:]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in))
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("parse: %v", err)
			}
			if len(tc.in) > 20 && strings.Contains(err.Error(), tc.in[len(fileHeader):]) {
				t.Errorf("error %q holds the input", err)
			}
		})
	}
	if _, err := Parse([]byte(strings.TrimSpace(string(good)))); err != nil {
		t.Errorf("without the final newline: %v", err)
	}
	if _, err := Parse([]byte(strings.TrimSpace(string(good)) + "\r\n")); err != nil {
		t.Errorf("with CRLF: %v", err)
	}
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	k, file, _ := Generate()
	p := filepath.Join(dir, "kek")
	if err := os.WriteFile(p, file, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(p)
	if err != nil || got.Fingerprint() != k.Fingerprint() {
		t.Fatalf("read: %v %v", got, err)
	}
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("group-readable: %v", err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat(file, 200), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(big); err == nil || strings.Contains(err.Error(), string(file[len(fileHeader):len(fileHeader)+10])) {
		t.Errorf("big: %v", err)
	}
	if _, err := ReadFile(dir); err == nil {
		t.Error("a directory was read as a key")
	}
	if _, err := ReadFile(filepath.Join(dir, "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
}

// FuzzOpen feeds Open any blob: it never panics, and it opens only what
// Seal made under this KEK for this name and version.
func FuzzOpen(f *testing.F) {
	k, err := Parse([]byte(fileHeader + strings.Repeat("A", 43)))
	if err != nil {
		f.Fatal(err)
	}
	good, _ := k.Seal("serving-ca.key", 1, []byte("plain"))
	f.Add(good, "serving-ca.key", uint32(1))
	f.Add([]byte{1}, "x", uint32(0))
	f.Add([]byte{}, "", uint32(7))
	f.Add(append([]byte{2}, good[1:]...), "serving-ca.key", uint32(1))
	f.Fuzz(func(t *testing.T, blob []byte, name string, version uint32) {
		plain, err := k.Open(name, version, blob)
		if err == nil {
			// good differs in each fuzzing process (its nonce), so the
			// check is on what was sealed, which only Seal could make.
			if name != "serving-ca.key" || version != 1 || string(plain) != "plain" {
				t.Fatalf("opened a blob Seal did not make: %x %q %d -> %q", blob, name, version, plain)
			}
			return
		}
		if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrNotOpened) {
			t.Fatalf("error %v is neither ErrMalformed nor ErrNotOpened", err)
		}
	})
}

// FuzzParse feeds Parse any file: it never panics and a KEK it accepts
// writes back to the same line.
func FuzzParse(f *testing.F) {
	_, good, _ := Generate()
	f.Add(good)
	f.Add([]byte(fileHeader))
	f.Add([]byte("bcgw-kek-v1:====\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if k.Fingerprint() == "" {
			t.Fatal("no fingerprint")
		}
	})
}
