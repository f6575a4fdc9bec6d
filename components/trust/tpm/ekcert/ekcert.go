// Package ekcert verifies a TPM's endorsement key certificate against the
// EK CAs a verifier trusts (bcgw's enrolled EK CAs). It is apart from
// components/trust/tpm so that what links the TPM without verifying
// certificates (bcd helper) does not link crypto/x509.
package ekcert

import (
	"crypto"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"

	"github.com/better-compute/bcd/components/trust/tpm/ek"
)

// Extensions an EK certificate may mark critical that crypto/x509 leaves
// unhandled: the subject alternative name holding the TPM's manufacturer,
// model and version as a directoryName (TCG EK Credential Profile 3.2.9,
// critical when the subject is empty), and subject directory attributes
// (the TPM specification).
var (
	oidSubjectAltName       = asn1.ObjectIdentifier{2, 5, 29, 17}
	oidSubjectDirAttributes = asn1.ObjectIdentifier{2, 5, 29, 9}
)

// Verify checks that certDER is an EK certificate issued, through
// intermediates, by one of roots, valid now, and for the key of ekPub (an EK
// TPMT_PUBLIC that passes ek.PublicKey). The TCG extended key usage
// (tcg-kp-EKCertificate) is not required, since not every vendor sets it.
func Verify(certDER, ekPub []byte, roots, intermediates *x509.CertPool) error {
	key, err := ek.PublicKey(ekPub)
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
