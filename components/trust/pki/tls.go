package pki

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
)

// TLSCertificate assembles a tls.Certificate from a leaf, its key and the
// rest of the chain to send (for a gateway: the serving CA).
func TLSCertificate(leaf *x509.Certificate, key crypto.Signer, chain ...*x509.Certificate) tls.Certificate {
	tc := tls.Certificate{PrivateKey: key, Leaf: leaf}
	if leaf != nil {
		tc.Certificate = append(tc.Certificate, leaf.Raw)
	}
	for _, c := range chain {
		if c != nil {
			tc.Certificate = append(tc.Certificate, c.Raw)
		}
	}
	return tc
}

// ClientTLS returns a TLS 1.3 client configuration that trusts only the
// serving CA identified by servingCAPin. The server must present its leaf and
// the serving CA; the certificate matching the pin becomes the only root and
// the leaf must verify against it for serverName with ServerAuth. System roots
// are never consulted. If clientCert is non-nil it is always offered.
func ClientTLS(servingCAPin, serverName string, clientCert *tls.Certificate) (*tls.Config, error) {
	want, err := ParsePin(servingCAPin)
	if err != nil {
		return nil, fmt.Errorf("client TLS config: serving_ca_spki_pin: %w", err)
	}
	if serverName == "" {
		return nil, errors.New("client TLS config: server name is empty")
	}
	if clientCert != nil && (len(clientCert.Certificate) == 0 || clientCert.PrivateKey == nil) {
		return nil, errors.New("client TLS config: client certificate has no chain or no private key")
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		ServerName: serverName,
		NextProtos: []string{"h2"},
		// Standard verification is replaced by VerifyConnection below, which
		// runs on every handshake including resumptions.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return VerifyPinnedChain(cs.PeerCertificates, want, serverName, "gateway", "serving_ca_spki_pin")
		},
	}
	if clientCert != nil {
		cc := *clientCert
		// GetClientCertificate offers the certificate even when the server's
		// acceptable-CA list does not name its issuer, so a mismatch is
		// reported by the server instead of silently sending no certificate.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &cc, nil
		}
	}
	return cfg, nil
}

// VerifyPinnedChain checks a server's chain against a pin: one of its
// certificates must have the pinned key, and the leaf must verify for
// serverName (ServerAuth) with that certificate as the only root. System
// roots are never consulted. who names the server and pinName the pin in
// errors ("gateway", "serving_ca_spki_pin").
func VerifyPinnedChain(chain []*x509.Certificate, want [32]byte, serverName, who, pinName string) error {
	if len(chain) == 0 {
		return errors.New(who + " presented no certificate")
	}
	rootIdx := -1
	for i, c := range chain {
		if spkiMatches(want, c.RawSubjectPublicKeyInfo) {
			rootIdx = i
			break
		}
	}
	if rootIdx < 0 {
		return errors.New(who + " certificate does not chain to " + pinName)
	}
	roots := x509.NewCertPool()
	roots.AddCert(chain[rootIdx])
	inter := x509.NewCertPool()
	for i, c := range chain[1:] {
		if i+1 != rootIdx {
			inter.AddCert(c)
		}
	}
	_, err := chain[0].Verify(x509.VerifyOptions{
		DNSName:       serverName,
		Roots:         roots,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("verify %s certificate against %s: %w", who, pinName, err)
	}
	return nil
}

// ServerTLS returns a TLS 1.3 server configuration presenting serving (leaf
// plus serving CA chain, see TLSCertificate) and verifying client
// certificates, when given, against nodeCA only. A nil nodeCA rejects every
// client certificate.
func ServerTLS(serving tls.Certificate, nodeCA *x509.Certificate) *tls.Config {
	pool := x509.NewCertPool()
	if nodeCA != nil {
		pool.AddCert(nodeCA)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		MaxVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{serving},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    pool,
		NextProtos:   []string{"h2", "http/1.1"},
	}
}
