// Package filehash hashes files: the SHA-256 of a file's contents, as the
// lowercase hex that release manifests and the journal's snapshot head
// carry.
package filehash

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
)

// SHA256 is the SHA-256 (lowercase hex) of the file at path, read whole.
func SHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return Reader(f, path)
}

// Reader is the SHA-256 (lowercase hex) of what r holds to its end; name
// is what an error calls it.
func Reader(r io.Reader, name string) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", fmt.Errorf("read %s: %w", name, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ValidDigest reports whether s is a SHA-256 as this package spells it:
// 64 lowercase hex digits (what names an image by its content).
func ValidDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
