package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

const pemTypePrivateKey = "PRIVATE KEY"

// GenerateKey returns a new ECDSA P-256 private key.
func GenerateKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate P-256 key: %w", err)
	}
	return k, nil
}

// MarshalPrivateKeyPEM encodes an ECDSA P-256 private key as a PKCS#8 PEM
// block of type "PRIVATE KEY".
func MarshalPrivateKeyPEM(k crypto.Signer) ([]byte, error) {
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok || ek == nil {
		return nil, fmt.Errorf("marshal private key: %s, want ECDSA P-256", keyTypeName(k))
	}
	if ek.Curve != elliptic.P256() {
		return nil, errors.New("marshal private key: ECDSA curve is not P-256")
	}
	der, err := x509.MarshalPKCS8PrivateKey(ek)
	if err != nil {
		return nil, fmt.Errorf("marshal private key as PKCS#8: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemTypePrivateKey, Bytes: der}), nil
}

// ParsePrivateKeyPEM decodes the first PEM block of b, which must be a PKCS#8
// "PRIVATE KEY" holding an ECDSA P-256 key.
func ParsePrivateKeyPEM(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("parse private key: no PEM block found")
	}
	if blk.Type != pemTypePrivateKey {
		return nil, fmt.Errorf("parse private key: PEM block type %q, want %q (PKCS#8)", truncate(blk.Type, 40), pemTypePrivateKey)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		// x509 errors describe the structure, never the key bytes.
		return nil, fmt.Errorf("parse PKCS#8 private key: %w", err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("parse private key: %s, want ECDSA P-256", keyTypeName(k))
	}
	if ek.Curve != elliptic.P256() {
		return nil, fmt.Errorf("parse private key: ECDSA curve %s, want P-256", ek.Curve.Params().Name)
	}
	return ek, nil
}

// p256Public returns pub as an ECDSA P-256 public key or an error saying what
// it is instead.
func p256Public(pub crypto.PublicKey) (*ecdsa.PublicKey, error) {
	ep, ok := pub.(*ecdsa.PublicKey)
	if !ok || ep == nil {
		return nil, fmt.Errorf("public key is %s, want ECDSA P-256", keyTypeName(pub))
	}
	if ep.Curve != elliptic.P256() {
		name := "unknown"
		if ep.Curve != nil {
			name = ep.Curve.Params().Name
		}
		return nil, fmt.Errorf("public key curve is %s, want P-256", name)
	}
	return ep, nil
}

// signerP256 checks that k is a usable signer with a P-256 public key.
func signerP256(k crypto.Signer) (*ecdsa.PublicKey, error) {
	if k == nil {
		return nil, errors.New("signing key is nil")
	}
	if ek, ok := k.(*ecdsa.PrivateKey); ok && ek == nil {
		return nil, errors.New("signing key is nil")
	}
	return p256Public(k.Public())
}

func keyTypeName(k any) string {
	if k == nil {
		return "no key"
	}
	return fmt.Sprintf("%T", k)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
