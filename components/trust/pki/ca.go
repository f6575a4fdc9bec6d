package pki

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"time"
)

const pemTypeCertificate = "CERTIFICATE"

// clockSkew is how far NotBefore is backdated on issued certificates.
const clockSkew = time.Minute

// CA is a certificate authority: a CA certificate and its private key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA creates a self-signed P-256 CA certificate valid for validity. It may
// sign only end-entity certificates (MaxPathLen 0).
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	if validity <= 0 {
		return nil, errors.New("create CA: validity must be positive")
	}
	key, err := GenerateKey()
	if err != nil {
		return nil, fmt.Errorf("create CA: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("create CA: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		SignatureAlgorithm:    x509.ECDSAWithSHA256,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse new CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// LoadCA loads a CA from a PEM certificate and a PKCS#8 PEM private key. The
// certificate must be a CA allowed to sign certificates and the key must
// match it.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	blk, _ := pem.Decode(certPEM)
	if blk == nil {
		return nil, errors.New("load CA: no PEM block in certificate")
	}
	if blk.Type != pemTypeCertificate {
		return nil, fmt.Errorf("load CA: certificate PEM block type %q, want %q", truncate(blk.Type, 40), pemTypeCertificate)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("load CA certificate: %w", err)
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return nil, errors.New("load CA: certificate is not a CA")
	}
	if cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("load CA: certificate lacks the cert-sign key usage")
	}
	certPub, err := p256Public(cert.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("load CA certificate: %w", err)
	}
	key, err := ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load CA key: %w", err)
	}
	if !certPub.Equal(key.Public()) {
		return nil, errors.New("load CA: private key does not match certificate")
	}
	return &CA{Cert: cert, Key: key}, nil
}

// CertPEM returns the CA certificate as a PEM "CERTIFICATE" block.
func (ca *CA) CertPEM() []byte {
	if ca == nil || ca.Cert == nil {
		return nil
	}
	return CertPEM(ca.Cert)
}

// KeyPEM returns the CA private key as PKCS#8 PEM.
func (ca *CA) KeyPEM() ([]byte, error) {
	if ca == nil {
		return nil, errors.New("marshal CA key: CA is nil")
	}
	return MarshalPrivateKeyPEM(ca.Key)
}

// CertPEM encodes a certificate as a PEM "CERTIFICATE" block.
func CertPEM(c *x509.Certificate) []byte {
	if c == nil {
		return nil
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemTypeCertificate, Bytes: c.Raw})
}

// ParseCertPEM parses every "CERTIFICATE" block in b, in order. It fails if
// there is none or a block of another type is present.
func ParseCertPEM(b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := b
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != pemTypeCertificate {
			return nil, fmt.Errorf("parse certificate PEM: block type %q, want %q", truncate(blk.Type, 40), pemTypeCertificate)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate %d: %w", len(certs), err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("parse certificate PEM: no certificate found")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("parse certificate PEM: trailing data after last certificate")
	}
	return certs, nil
}

// IssueServer issues a TLS server certificate (ExtKeyUsageServerAuth) for an
// ECDSA P-256 public key. At least one DNS name or IP is required; the first
// DNS name (else IP) becomes the common name. NotAfter never exceeds the CA's.
func (ca *CA) IssueServer(pub crypto.PublicKey, dnsNames []string, ips []net.IP, validity time.Duration) (*x509.Certificate, error) {
	if len(dnsNames) == 0 && len(ips) == 0 {
		return nil, errors.New("issue server certificate: no DNS names or IP addresses")
	}
	cn := ""
	if len(dnsNames) > 0 {
		cn = dnsNames[0]
	} else {
		cn = ips[0].String()
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		DNSNames:    dnsNames,
		IPAddresses: ips,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	c, err := ca.issue(tmpl, pub, validity)
	if err != nil {
		return nil, fmt.Errorf("issue server certificate: %w", err)
	}
	return c, nil
}

// IssueClient issues a TLS client certificate (ExtKeyUsageClientAuth) for an
// ECDSA P-256 public key, with spiffeID as its only URI SAN and, if org is
// non-empty, Subject.OrganizationalUnit = [org], and the extra extensions
// (bcgw's AK extension). NotAfter never exceeds the CA's.
func (ca *CA) IssueClient(pub crypto.PublicKey, commonName string, spiffeID *url.URL, org string, validity time.Duration, extra ...pkix.Extension) (*x509.Certificate, error) {
	if _, _, _, err := ParseSPIFFEID(spiffeID); err != nil {
		return nil, fmt.Errorf("issue client certificate: %w", err)
	}
	subj := pkix.Name{CommonName: commonName}
	if org != "" {
		subj.OrganizationalUnit = []string{org}
	}
	u := *spiffeID
	tmpl := &x509.Certificate{
		Subject:         subj,
		URIs:            []*url.URL{&u},
		ExtKeyUsage:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		ExtraExtensions: extra,
	}
	c, err := ca.issue(tmpl, pub, validity)
	if err != nil {
		return nil, fmt.Errorf("issue client certificate: %w", err)
	}
	return c, nil
}

// issue fills the common end-entity fields of tmpl and signs it.
func (ca *CA) issue(tmpl *x509.Certificate, pub crypto.PublicKey, validity time.Duration) (*x509.Certificate, error) {
	if ca == nil || ca.Cert == nil || ca.Key == nil {
		return nil, errors.New("CA is not loaded")
	}
	if validity <= 0 {
		return nil, errors.New("validity must be positive")
	}
	if _, err := p256Public(pub); err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	if !notAfter.After(now) {
		return nil, errors.New("CA certificate has expired")
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-clockSkew)
	tmpl.NotAfter = notAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.BasicConstraintsValid = true
	tmpl.IsCA = false
	tmpl.SignatureAlgorithm = x509.ECDSAWithSHA256
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate: %w", err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse issued certificate: %w", err)
	}
	return c, nil
}

// randomSerial returns a uniformly random serial in [1, 2^128).
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	limit.Sub(limit, big.NewInt(1))
	n, err := rand.Int(rand.Reader, limit)
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}
