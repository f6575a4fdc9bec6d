package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// Signature purposes. A signature made for one purpose never verifies for
// another.
const (
	PurposeJoinResponse = "bcd/join-response/v1"
	PurposeRenew        = "bcd/renew/v1"
	PurposeJoinToken    = "bcd/join-token/v1" // reserved
)

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
