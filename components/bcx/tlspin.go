package bcx

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// serverName is the name both sides use in TLS; nothing checks it, the
// certificates are pinned whole.
const serverName = "bcx-plugin"

// newCert makes a fresh self-signed ECDSA P-256 certificate for one plugin
// run (host or plugin side); its key never leaves the process.
func newCert(cn string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     []string{serverName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("create certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// pinned accepts exactly the peer certificate want (byte for byte), on
// full and resumed handshakes alike.
func pinned(want []byte) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) != 1 || !bytes.Equal(cs.PeerCertificates[0].Raw, want) {
			return errors.New("bcx: the peer's certificate is not the pinned one")
		}
		return nil
	}
}

// clientTLS is the host's side: its own certificate, the plugin's pinned.
func clientTLS(own tls.Certificate, plugin []byte) *tls.Config {
	return &tls.Config{
		Certificates:       []tls.Certificate{own},
		ServerName:         serverName,
		InsecureSkipVerify: true, // replaced by the exact pin below
		VerifyConnection:   pinned(plugin),
		MinVersion:         tls.VersionTLS13,
		NextProtos:         []string{"h2"},
	}
}

// serverTLS is the plugin's side: its own certificate, the host's pinned.
func serverTLS(own tls.Certificate, host []byte) *tls.Config {
	return &tls.Config{
		Certificates:     []tls.Certificate{own},
		ClientAuth:       tls.RequireAnyClientCert, // checked by the exact pin below
		VerifyConnection: pinned(host),
		MinVersion:       tls.VersionTLS13,
		NextProtos:       []string{"h2"},
	}
}
