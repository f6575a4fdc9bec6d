package adminapi

import (
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"fmt"

	"github.com/better-compute/bcd/components/trust/pki"
)

// CanonicalKey checks that der is an ECDSA P-256 SPKI and re-encodes it;
// what (for errors) says what the key is to be.
func CanonicalKey(der []byte, what string) ([]byte, error) {
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("not a public key: %w", err)
	}
	ep, ok := pub.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("the key is %s; %s must be an ECDSA P-256 key", keyKind(pub), what)
	}
	if ep.Curve != elliptic.P256() {
		return nil, fmt.Errorf("the key is ECDSA on %s; %s must be an ECDSA P-256 key", ep.Curve.Params().Name, what)
	}
	return x509.MarshalPKIXPublicKey(ep)
}

func keyKind(pub any) string {
	switch pub.(type) {
	case *rsa.PublicKey:
		return "an RSA key"
	case ed25519.PublicKey:
		return "an Ed25519 key"
	case *ecdh.PublicKey:
		return "an X25519 key"
	default:
		return fmt.Sprintf("a %T", pub)
	}
}

// TruncateString is s cut to n bytes, marked when it was cut.
func TruncateString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// PinOfSPKI is the pin of an SPKI DER.
func PinOfSPKI(der []byte) string {
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return "(unparseable key)"
	}
	p, err := pki.Pin(pub)
	if err != nil {
		return "(unparseable key)"
	}
	return p
}
