// Package kek seals the gateway's long-lived keys under a key-encryption
// key (KEK): 32 random bytes the operator gives every gateway of a fleet
// out of band, as a file. The keys then live in the database the gateways
// share, each sealed with AES-256-GCM under the KEK, its name and version
// bound in as associated data, so the database alone opens none of them
// and a sealed key cannot pass for another. docs/gateway-store.md ("Keys")
// says how bcgw uses it; docs/decisions.md says why.
//
// A KEK never leaves this package in a form that prints: its String is
// its fingerprint, and errors name files and key names, never bytes.
package kek

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/better-compute/bcd/components/base/privfile"
)

// Size is a KEK's length in bytes (AES-256).
const Size = 32

// fileHeader starts a KEK file; the key follows in unpadded base64url.
const fileHeader = "bcgw-kek-v1:"

// blobVersion is the first byte of a sealed blob.
const blobVersion = 1

// nonceSize and tagSize are AES-GCM's.
const (
	nonceSize = 12
	tagSize   = 16
)

// MaxFile is the largest KEK file read: the line is 56 bytes.
const MaxFile = 4 << 10

// Errors of Parse and Open.
var (
	// ErrMalformed: the bytes are not a KEK file or not a sealed blob.
	ErrMalformed = errors.New("malformed")
	// ErrNotOpened: the blob is well-formed but does not open under this
	// KEK for this name and version: it was changed, sealed for another
	// key name, or sealed under another KEK.
	ErrNotOpened = errors.New("does not open under this key-encryption key (changed in the database, or sealed under another key-encryption key)")
)

// KEK is a key-encryption key.
type KEK struct {
	aead cipher.AEAD
	fp   string
}

// String is the fingerprint: a KEK printed by mistake shows nothing secret.
func (k *KEK) String() string { return "key-encryption key " + k.fp }

// GoString is String (%#v).
func (k *KEK) GoString() string { return k.String() }

// Fingerprint names the KEK without revealing it: "sha256:" and the first
// 16 bytes of a SHA-256 of the key under a label of its own, in hex. The
// database stores it so a gateway given another KEK is told so.
func (k *KEK) Fingerprint() string { return k.fp }

func fromKey(key []byte) (*KEK, error) {
	if len(key) != Size {
		return nil, fmt.Errorf("key-encryption key: %d bytes, want %d: %w", len(key), Size, ErrMalformed)
	}
	blk, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write([]byte("bcgw key-encryption key fingerprint v1\x00"))
	h.Write(key)
	return &KEK{aead: aead, fp: "sha256:" + hex.EncodeToString(h.Sum(nil)[:16])}, nil
}

// Generate makes a KEK from crypto/rand and returns it with its file's
// contents (one line).
func Generate() (*KEK, []byte, error) {
	key := make([]byte, Size)
	defer clear(key)
	if _, err := io.ReadFull(rand.Reader, key); err != nil {
		return nil, nil, fmt.Errorf("random key-encryption key: %w", err)
	}
	k, err := fromKey(key)
	if err != nil {
		return nil, nil, err
	}
	file := make([]byte, 0, len(fileHeader)+base64.RawURLEncoding.EncodedLen(Size)+1)
	file = append(file, fileHeader...)
	file = base64.RawURLEncoding.AppendEncode(file, key)
	file = append(file, '\n')
	return k, file, nil
}

// Parse reads a KEK file's contents: "bcgw-kek-v1:" and 32 bytes in
// unpadded base64url, one line (a final newline allowed). Errors never
// hold the input.
func Parse(b []byte) (*KEK, error) {
	line := bytes.TrimSuffix(b, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	if !bytes.HasPrefix(line, []byte(fileHeader)) {
		return nil, fmt.Errorf("key-encryption key: does not start with %q (make one with bcgw kek generate): %w", fileHeader, ErrMalformed)
	}
	enc := line[len(fileHeader):]
	if len(enc) != base64.RawURLEncoding.EncodedLen(Size) {
		return nil, fmt.Errorf("key-encryption key: want %d base64url characters after %q, got %d: %w",
			base64.RawURLEncoding.EncodedLen(Size), fileHeader, len(enc), ErrMalformed)
	}
	key := make([]byte, Size)
	defer clear(key)
	if n, err := base64.RawURLEncoding.Strict().Decode(key, enc); err != nil || n != Size {
		return nil, fmt.Errorf("key-encryption key: not base64url: %w", ErrMalformed)
	}
	return fromKey(key)
}

// ReadFile reads a KEK file that only its owner may read (a regular file,
// no group or other permissions, at most MaxFile bytes). Errors name the
// file, never its contents.
func ReadFile(path string) (*KEK, error) {
	b, err := privfile.Read(path, MaxFile, "a key-encryption key file is one short line")
	if err != nil {
		return nil, err
	}
	defer clear(b)
	k, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// aad binds a sealed blob to its key name and version.
func aad(name string, version uint32) []byte {
	b := make([]byte, 0, 32+len(name))
	b = append(b, "bcgw sealed key v1\x00"...)
	b = append(b, name...)
	b = append(b, 0)
	return binary.BigEndian.AppendUint32(b, version)
}

// Seal encrypts plain, the key called name at version, as one blob: a
// format byte (1), a random 12-byte nonce, then the AES-256-GCM
// ciphertext with its tag; name and version are the associated data.
func (k *KEK) Seal(name string, version uint32, plain []byte) ([]byte, error) {
	out := make([]byte, 1+nonceSize, 1+nonceSize+len(plain)+tagSize)
	out[0] = blobVersion
	if _, err := io.ReadFull(rand.Reader, out[1:]); err != nil {
		return nil, fmt.Errorf("seal %s: nonce: %w", name, err)
	}
	return k.aead.Seal(out, out[1:], plain, aad(name, version)), nil
}

// Open checks and decrypts a blob Seal made for name at version. Every
// failure is ErrMalformed (not a blob of this format) or ErrNotOpened,
// wrapped with the key's name.
func (k *KEK) Open(name string, version uint32, blob []byte) ([]byte, error) {
	if len(blob) < 1+nonceSize+tagSize {
		return nil, fmt.Errorf("sealed key %s: %d bytes, shorter than any sealed key: %w", name, len(blob), ErrMalformed)
	}
	if blob[0] != blobVersion {
		return nil, fmt.Errorf("sealed key %s: format %d, want %d: %w", name, blob[0], blobVersion, ErrMalformed)
	}
	plain, err := k.aead.Open(nil, blob[1:1+nonceSize], blob[1+nonceSize:], aad(name, version))
	if err != nil {
		return nil, fmt.Errorf("sealed key %s version %d: %w", name, version, ErrNotOpened)
	}
	return plain, nil
}
