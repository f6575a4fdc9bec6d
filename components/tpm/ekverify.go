package tpm

import (
	"crypto"
	"crypto/x509"
	"encoding/asn1"
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

// Extensions an EK certificate may mark critical that crypto/x509 leaves
// unhandled: the subject alternative name holding the TPM's manufacturer,
// model and version as a directoryName (TCG EK Credential Profile 3.2.9,
// critical when the subject is empty), and subject directory attributes
// (the TPM specification).
var (
	oidSubjectAltName       = asn1.ObjectIdentifier{2, 5, 29, 17}
	oidSubjectDirAttributes = asn1.ObjectIdentifier{2, 5, 29, 9}
)

// VerifyEKCertificate checks that certDER is an EK certificate issued, through
// intermediates, by one of roots, valid now, and for the key of ekPub (an EK
// TPMT_PUBLIC that passes EKPublicKey). The TCG extended key usage
// (tcg-kp-EKCertificate) is not required, since not every vendor sets it.
func VerifyEKCertificate(certDER, ekPub []byte, roots, intermediates *x509.CertPool) error {
	key, err := EKPublicKey(ekPub)
	if err != nil {
		return err
	}
	c, err := x509.ParseCertificate(certDER)
	if err != nil {
		return fmt.Errorf("EK certificate: %w", err)
	}
	pk, ok := c.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pk.Equal(key) {
		return errors.New("the EK certificate is for another key than the EK")
	}
	var unhandled []asn1.ObjectIdentifier
	for _, oid := range c.UnhandledCriticalExtensions {
		if !oid.Equal(oidSubjectAltName) && !oid.Equal(oidSubjectDirAttributes) {
			unhandled = append(unhandled, oid)
		}
	}
	c.UnhandledCriticalExtensions = unhandled
	if _, err := c.Verify(x509.VerifyOptions{Roots: roots, Intermediates: intermediates, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("EK certificate: %w", err)
	}
	return nil
}
