package tpm

import (
	"crypto"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
)

// EKPublicKey checks that ekPub (a TPMT_PUBLIC) is an endorsement key, a
// restricted decryption key fixed to its TPM and generated inside it, and
// returns its public key (*rsa.PublicKey or *ecdsa.PublicKey). A verifier
// compares it with an enrolled key or the key of an EK certificate.
func EKPublicKey(ekPub []byte) (crypto.PublicKey, error) {
	p, err := parsePublic(ekPub)
	if err != nil {
		return nil, fmt.Errorf("EK %w", err)
	}
	a := p.ObjectAttributes
	if !a.Restricted || !a.Decrypt || a.SignEncrypt || !a.FixedTPM || !a.FixedParent || !a.SensitiveDataOrigin {
		return nil, errors.New("the EK is not a restricted decryption key made in and fixed to its TPM")
	}
	if p.NameAlg != tpm2.TPMAlgSHA256 {
		return nil, fmt.Errorf("the EK's name algorithm is %#x, want SHA-256", uint16(p.NameAlg))
	}
	k, err := tpm2.Pub(*p)
	if err != nil {
		return nil, fmt.Errorf("EK public key = %w", err)
	}
	return k, nil
}
