package pki

import (
	"crypto"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/better-compute/bcd/components/trust/pki/es256"
)

// PinPrefix starts every SPKI pin.
const PinPrefix = es256.PinPrefix

// pinBodyLen is the length of std base64 (padded) of 32 bytes.
const pinBodyLen = 44

// Pin returns the SPKI pin of pub: "sha256/" followed by the padded standard
// base64 of the SHA-256 of its DER SubjectPublicKeyInfo.
func Pin(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("marshal public key for pin: %w", err)
	}
	return pinOfSPKI(der), nil
}

// PinOfCert returns the SPKI pin of the certificate's public key.
func PinOfCert(c *x509.Certificate) string {
	if c == nil {
		return ""
	}
	return pinOfSPKI(c.RawSubjectPublicKeyInfo)
}

func pinOfSPKI(der []byte) string {
	sum := sha256.Sum256(der)
	return PinPrefix + base64.StdEncoding.EncodeToString(sum[:])
}

// ParsePin validates a pin and returns the SHA-256 digest it carries. Errors
// say what is wrong without echoing the input beyond the expected prefix.
func ParsePin(s string) ([32]byte, error) {
	var out [32]byte
	body, ok := strings.CutPrefix(s, PinPrefix)
	if !ok {
		return out, fmt.Errorf("parse pin: missing %q prefix", PinPrefix)
	}
	if len(body) != pinBodyLen {
		return out, fmt.Errorf("parse pin: %d base64 characters after %q, want %d", len(body), PinPrefix, pinBodyLen)
	}
	// Strict rejects non-zero padding bits, so every digest has exactly one
	// spelling. Length is fixed above; a decoded length other than 32 means
	// the decoder skipped characters such as newlines.
	var buf [33]byte // DecodedLen(44); Decode needs room for unpadded input
	n, err := base64.StdEncoding.Strict().Decode(buf[:], []byte(body))
	if err != nil {
		return out, errors.New("parse pin: not valid padded standard base64")
	}
	if n != len(out) {
		return out, fmt.Errorf("parse pin: decodes to %d bytes, want %d", n, len(out))
	}
	copy(out[:], buf[:n])
	return out, nil
}

// MatchPin returns nil if pub's SPKI pin equals pin.
func MatchPin(pin string, pub crypto.PublicKey) error {
	want, err := ParsePin(pin)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return fmt.Errorf("marshal public key for pin: %w", err)
	}
	if !spkiMatches(want, der) {
		return errors.New("key does not match pin")
	}
	return nil
}

func spkiMatches(want [32]byte, spkiDER []byte) bool {
	got := sha256.Sum256(spkiDER)
	return subtle.ConstantTimeCompare(want[:], got[:]) == 1
}
