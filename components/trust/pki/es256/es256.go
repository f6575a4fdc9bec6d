// Package es256 is bcd's framed ES256 signature (a signature made for one
// purpose never verifies for another) and the SPKI pin prefix, on their
// own so that what verifies a signature (the release manifest, in bcd
// helper too) links no TLS or JOSE code; components/trust/pki re-exports
// them.
package es256

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// PinPrefix starts every SPKI pin.
const PinPrefix = "sha256/"

const (
	sigDomain = "bcd-sig-v1"
	// SignatureSize is the length of an ES256 raw r||s signature.
	SignatureSize = 64
)

// Sign signs msg for purpose with an ECDSA P-256 key. The signed digest is
// sha256("bcd-sig-v1" || 0x00 || purpose || 0x00 || msg) and the signature is
// the 64-byte raw r||s encoding (ES256).
func Sign(k crypto.Signer, purpose string, msg []byte) ([]byte, error) {
	if err := checkPurpose(purpose); err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	if _, err := signerP256(k); err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	digest := framedDigest(purpose, msg)
	der, err := k.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	var rs struct{ R, S *big.Int }
	rest, err := asn1.Unmarshal(der, &rs)
	if err != nil || len(rest) != 0 || rs.R == nil || rs.S == nil ||
		rs.R.Sign() <= 0 || rs.S.Sign() <= 0 || rs.R.BitLen() > 256 || rs.S.BitLen() > 256 {
		return nil, errors.New("sign: signer returned a malformed ECDSA signature")
	}
	out := make([]byte, SignatureSize)
	rs.R.FillBytes(out[:32])
	rs.S.FillBytes(out[32:])
	return out, nil
}

// Verify checks a signature made by Sign for the same purpose and msg.
func Verify(pub crypto.PublicKey, purpose string, msg, sig []byte) error {
	if err := checkPurpose(purpose); err != nil {
		return fmt.Errorf("verify signature: %w", err)
	}
	ep, err := p256Public(pub)
	if err != nil {
		return fmt.Errorf("verify signature: %w", err)
	}
	if len(sig) != SignatureSize {
		return fmt.Errorf("verify signature: signature is %d bytes, want %d", len(sig), SignatureSize)
	}
	r := new(big.Int).SetBytes(sig[:32])
	s := new(big.Int).SetBytes(sig[32:])
	digest := framedDigest(purpose, msg)
	if !ecdsa.Verify(ep, digest[:], r, s) {
		return errors.New("verify signature: signature does not match key, purpose and message")
	}
	return nil
}

func checkPurpose(purpose string) error {
	if purpose == "" {
		return errors.New("purpose is empty")
	}
	if strings.IndexByte(purpose, 0) >= 0 {
		return errors.New("purpose contains a NUL byte")
	}
	return nil
}

func framedDigest(purpose string, msg []byte) [32]byte {
	h := sha256.New()
	h.Write([]byte(sigDomain))
	h.Write([]byte{0})
	h.Write([]byte(purpose))
	h.Write([]byte{0})
	h.Write(msg)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

func p256Public(pub crypto.PublicKey) (*ecdsa.PublicKey, error) {
	ep, ok := pub.(*ecdsa.PublicKey)
	if !ok || ep == nil {
		if pub == nil {
			return nil, errors.New("public key is no key, want ECDSA P-256")
		}
		return nil, fmt.Errorf("public key is %T, want ECDSA P-256", pub)
	}
	if ep.Curve != elliptic.P256() {
		name := "unknown"
		if ep.Curve != nil {
			name = ep.Curve.Params().Name
		}
		return nil, fmt.Errorf("public key curve is %s, want P-256", name)
	}
	return ep, nil
}

// signerP256 checks that k is a usable signer with a P-256 public key.
func signerP256(k crypto.Signer) (*ecdsa.PublicKey, error) {
	if k == nil {
		return nil, errors.New("signing key is nil")
	}
	if ek, ok := k.(*ecdsa.PrivateKey); ok && ek == nil {
		return nil, errors.New("signing key is nil")
	}
	return p256Public(k.Public())
}

// The SubjectPublicKeyInfo of a P-256 key (RFC 5480).
var (
	oidECPublicKey = asn1.ObjectIdentifier{1, 2, 840, 10045, 2, 1}
	oidP256        = asn1.ObjectIdentifier{1, 2, 840, 10045, 3, 1, 7}
)

type spki struct {
	Algorithm struct {
		Algorithm  asn1.ObjectIdentifier
		Parameters asn1.ObjectIdentifier
	}
	PublicKey asn1.BitString
}

// MarshalSPKI is the DER SubjectPublicKeyInfo of a P-256 key, the bytes
// x509.MarshalPKIXPublicKey writes (without linking crypto/x509).
func MarshalSPKI(pub crypto.PublicKey) ([]byte, error) {
	ep, err := p256Public(pub)
	if err != nil {
		return nil, err
	}
	b, err := ep.Bytes()
	if err != nil {
		return nil, err
	}
	var s spki
	s.Algorithm.Algorithm, s.Algorithm.Parameters = oidECPublicKey, oidP256
	s.PublicKey = asn1.BitString{Bytes: b, BitLength: 8 * len(b)}
	return asn1.Marshal(s)
}

// ParseSPKI parses the DER SubjectPublicKeyInfo of a P-256 key; any other
// key, or bytes that are not exactly what MarshalSPKI writes, are refused.
func ParseSPKI(der []byte) (*ecdsa.PublicKey, error) {
	var s spki
	rest, err := asn1.Unmarshal(der, &s)
	switch {
	case err != nil:
		return nil, fmt.Errorf("public key: %w", err)
	case len(rest) != 0:
		return nil, errors.New("public key: bytes after the SubjectPublicKeyInfo")
	case !s.Algorithm.Algorithm.Equal(oidECPublicKey) || !s.Algorithm.Parameters.Equal(oidP256):
		return nil, errors.New("public key: not ECDSA P-256")
	case s.PublicKey.BitLength != 8*len(s.PublicKey.Bytes):
		return nil, errors.New("public key: a partial byte")
	}
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), s.PublicKey.Bytes)
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	if again, err := MarshalSPKI(pub); err != nil || !bytes.Equal(again, der) {
		return nil, errors.New("public key: not in its one DER encoding")
	}
	return pub, nil
}
