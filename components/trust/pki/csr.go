package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
)

// MaxCSRSize bounds the DER size ParseCSR accepts; a P-256 CSR is a few
// hundred bytes.
const MaxCSRSize = 16 << 10

// CreateCSR returns a DER certificate signing request for commonName signed
// with the ECDSA P-256 key k.
func CreateCSR(k crypto.Signer, commonName string) ([]byte, error) {
	if _, err := signerP256(k); err != nil {
		return nil, fmt.Errorf("create CSR: %w", err)
	}
	tmpl := &x509.CertificateRequest{
		Subject:            pkix.Name{CommonName: commonName},
		SignatureAlgorithm: x509.ECDSAWithSHA256,
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, k)
	if err != nil {
		return nil, fmt.Errorf("create CSR: %w", err)
	}
	return der, nil
}

// ParseCSR parses a DER CSR, checks its self-signature and requires an ECDSA
// P-256 key signed with ECDSA-SHA256.
func ParseCSR(der []byte) (*x509.CertificateRequest, error) {
	if len(der) == 0 {
		return nil, errors.New("parse CSR: empty")
	}
	if len(der) > MaxCSRSize {
		return nil, fmt.Errorf("parse CSR: %d bytes exceeds limit of %d", len(der), MaxCSRSize)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("parse CSR: %w", err)
	}
	if _, err := p256Public(csr.PublicKey); err != nil {
		return nil, fmt.Errorf("parse CSR: %w", err)
	}
	if csr.SignatureAlgorithm != x509.ECDSAWithSHA256 {
		return nil, fmt.Errorf("parse CSR: signature algorithm %s, want %s", csr.SignatureAlgorithm, x509.ECDSAWithSHA256)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("check CSR signature: %w", err)
	}
	return csr, nil
}
