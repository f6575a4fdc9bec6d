package gateway

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/pki"
)

// keys are the gateway's long-lived keys, made on first start and kept in
// the data directory (0600).
type keys struct {
	servingCA   *pki.CA
	nodeCA      *pki.CA
	serving     tls.Certificate
	joinSigning crypto.Signer
	signingSPKI []byte
	encJWK      *jose.JSONWebKey
	// workload signs workload tokens (JWTs for an audience), a key of its
	// own: a token holder learns nothing of the keys agents pin.
	workload crypto.Signer
}

const caValidity = 10 * 365 * 24 * time.Hour

func loadOrCreateCA(dir, name, cn string) (*pki.CA, error) {
	crtPath, keyPath := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	crt, err1 := os.ReadFile(crtPath)
	key, err2 := os.ReadFile(keyPath)
	if err1 == nil && err2 == nil {
		ca, err := pki.LoadCA(crt, key)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", crtPath, err)
		}
		return ca, nil
	}
	if !errors.Is(err1, fs.ErrNotExist) && err1 != nil {
		return nil, fmt.Errorf("read %s: %w", crtPath, err1)
	}
	ca, err := pki.NewCA(cn, caValidity)
	if err != nil {
		return nil, err
	}
	kb, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := identity.WriteFileAtomic(keyPath, kb, 0o600); err != nil {
		return nil, err
	}
	if err := identity.WriteFileAtomic(crtPath, ca.CertPEM(), 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

func loadOrCreateKeys(dir, serverName string, ips []net.IP) (*keys, error) {
	k := &keys{}
	var err error
	if k.servingCA, err = loadOrCreateCA(dir, "serving-ca", "bcgw serving CA"); err != nil {
		return nil, err
	}
	if k.nodeCA, err = loadOrCreateCA(dir, "node-ca", "bcgw node CA"); err != nil {
		return nil, err
	}
	// The serving leaf is issued anew at every start for the names asked.
	leafKey, err := pki.GenerateKey()
	if err != nil {
		return nil, err
	}
	names := []string{serverName, "localhost"}
	leaf, err := k.servingCA.IssueServer(leafKey.Public(), names, ips, 30*24*time.Hour)
	if err != nil {
		return nil, fmt.Errorf("issue serving certificate: %w", err)
	}
	k.serving = tls.Certificate{Certificate: [][]byte{leaf.Raw, k.servingCA.Cert.Raw}, PrivateKey: leafKey, Leaf: leaf}

	if k.joinSigning, err = loadOrCreateKey(filepath.Join(dir, "join-signing.key")); err != nil {
		return nil, err
	}
	if k.signingSPKI, err = x509.MarshalPKIXPublicKey(k.joinSigning.Public()); err != nil {
		return nil, fmt.Errorf("marshal join signing key: %w", err)
	}

	if k.workload, err = loadOrCreateKey(filepath.Join(dir, "workload-signing.key")); err != nil {
		return nil, err
	}

	encPath := filepath.Join(dir, "join-encryption.jwk")
	if b, err := os.ReadFile(encPath); err == nil {
		var jwk jose.JSONWebKey
		if err := json.Unmarshal(b, &jwk); err != nil || jwk.IsPublic() {
			return nil, fmt.Errorf("load %s: not a private JWK", encPath)
		}
		k.encJWK = &jwk
	} else {
		jwk, err := pki.GenerateEncryptionJWK()
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(jwk)
		if err != nil {
			return nil, fmt.Errorf("marshal join encryption key: %w", err)
		}
		if err := identity.WriteFileAtomic(encPath, b, 0o600); err != nil {
			return nil, err
		}
		k.encJWK = jwk
	}
	return k, nil
}

func (k *keys) pins() (serving, signing, encryption string, err error) {
	serving = pki.PinOfCert(k.servingCA.Cert)
	if signing, err = pki.Pin(k.joinSigning.Public()); err != nil {
		return
	}
	encryption, err = pki.JWKPin(k.encJWK)
	return
}

// loadOrCreateKey reads a P-256 key (PKCS#8 PEM) at path, or makes and
// stores one (0600).
func loadOrCreateKey(path string) (crypto.Signer, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		k, err := pki.ParsePrivateKeyPEM(b)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", path, err)
		}
		return k, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	key, err := pki.GenerateKey()
	if err != nil {
		return nil, err
	}
	kb, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, err
	}
	if err := identity.WriteFileAtomic(path, kb, 0o600); err != nil {
		return nil, err
	}
	return key, nil
}
