package pki

import (
	"crypto"

	"github.com/better-compute/bcd/components/trust/pki/es256"
)

// Signature purposes. A signature made for one purpose never verifies for
// another.
const (
	PurposeJoinResponse = "bcd/join-response/v1"
	PurposeRenew        = "bcd/renew/v1"
	PurposeJoinToken    = "bcd/join-token/v1" // reserved
)

// SignatureSize is the length of an ES256 raw r||s signature.
const SignatureSize = es256.SignatureSize

// Sign signs msg for purpose with an ECDSA P-256 key. The signed digest is
// sha256("bcd-sig-v1" || 0x00 || purpose || 0x00 || msg) and the signature is
// the 64-byte raw r||s encoding (ES256). It is es256.Sign.
func Sign(k crypto.Signer, purpose string, msg []byte) ([]byte, error) {
	return es256.Sign(k, purpose, msg)
}

// Verify checks a signature made by Sign for the same purpose and msg. It
// is es256.Verify.
func Verify(pub crypto.PublicKey, purpose string, msg, sig []byte) error {
	return es256.Verify(pub, purpose, msg, sig)
}
