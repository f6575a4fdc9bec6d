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
	digest := framedDigest(purpose, msg)
	if !ecdsa.VerifyASN1(ep, digest[:], DER(sig[:32], sig[32:])) {
		return errors.New("verify signature: signature does not match key, purpose and message")
	}
	return nil
}

// DER is the ASN.1 DER ECDSA-Sig-Value of r and s (each at most 126
// bytes, big-endian, unsigned), which ecdsa.VerifyASN1 reads: written
// here so that verifying links no encoding/asn1 or math/big.
func DER(r, s []byte) []byte {
	ri, si := derInteger(r), derInteger(s)
	out := append([]byte{0x30, byte(len(ri) + len(si))}, ri...)
	return append(out, si...)
}

// derInteger is a non-negative integer's DER INTEGER: minimal bytes, and
// a leading zero when the high bit is set.
func derInteger(b []byte) []byte {
	for len(b) > 0 && b[0] == 0 {
		b = b[1:]
	}
	if len(b) == 0 || b[0]&0x80 != 0 {
		b = append([]byte{0}, b...)
	}
	return append([]byte{0x02, byte(len(b))}, b...)
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

// spkiPrefix is the DER SubjectPublicKeyInfo of every P-256 key (RFC
// 5480: id-ecPublicKey, namedCurve prime256v1) up to its 65-byte
// uncompressed point: the key's one encoding, so it is compared, not
// parsed.
var spkiPrefix = []byte{
	0x30, 0x59, // SEQUENCE, 89 bytes
	0x30, 0x13, // SEQUENCE, 19 bytes: the algorithm
	0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, // OID 1.2.840.10045.2.1
	0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, // OID 1.2.840.10045.3.1.7
	0x03, 0x42, 0x00, // BIT STRING, 66 bytes, no unused bits
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
	return append(bytes.Clone(spkiPrefix), b...), nil
}

// ParseSPKI parses the DER SubjectPublicKeyInfo of a P-256 key; any other
// key, or bytes that are not exactly what MarshalSPKI writes, are refused.
func ParseSPKI(der []byte) (*ecdsa.PublicKey, error) {
	if len(der) != len(spkiPrefix)+65 || !bytes.HasPrefix(der, spkiPrefix) {
		return nil, errors.New("public key: not the DER SubjectPublicKeyInfo of an ECDSA P-256 key")
	}
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), der[len(spkiPrefix):])
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	return pub, nil
}
