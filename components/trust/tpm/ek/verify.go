package ek

import (
	"crypto"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
)

// PublicKey checks that ekPub (a TPMT_PUBLIC) is an endorsement key, a
// restricted decryption key fixed to its TPM and generated inside it, and
// returns its public key (*rsa.PublicKey or *ecdsa.PublicKey). A verifier
// compares it with an enrolled key or the key of an EK certificate.
func PublicKey(ekPub []byte) (crypto.PublicKey, error) {
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

// Name computes the TPM name of the object whose TPMT_PUBLIC is pub: its
// nameAlg followed by the nameAlg digest of pub. Only SHA-256 names are
// accepted.
func Name(pub []byte) ([]byte, error) {
	p, err := parsePublic(pub)
	if err != nil {
		return nil, err
	}
	if p.NameAlg != tpm2.TPMAlgSHA256 {
		return nil, fmt.Errorf("public area's name algorithm is %#x, want SHA-256", uint16(p.NameAlg))
	}
	d := sha256.Sum256(pub)
	return append([]byte{0x00, 0x0b}, d[:]...), nil
}

// parsePublic decodes a TPMT_PUBLIC that must re-encode to exactly pub.
func parsePublic(pub []byte) (*tpm2.TPMTPublic, error) {
	p, err := tpm2.Unmarshal[tpm2.TPMTPublic](pub)
	if err != nil {
		return nil, fmt.Errorf("parse TPMT_PUBLIC = %w", err)
	}
	if string(tpm2.Marshal(p)) != string(pub) {
		return nil, errors.New("parse TPMT_PUBLIC: trailing or non-canonical bytes")
	}
	return p, nil
}
