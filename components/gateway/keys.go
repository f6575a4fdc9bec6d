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
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/trust/pki"
)

// keys are the gateway's long-lived keys, made on first start and kept in
// the data directory (0600), or in the database sealed (sharedkeys.go).
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

func loadOrCreateCA(kf keyFiles, name, cn string) (*pki.CA, error) {
	crtName, keyName := name+".crt", name+".key"
	crt, err1 := kf.read(crtName)
	key, err2 := kf.read(keyName)
	if err1 == nil && err2 == nil {
		ca, err := pki.LoadCA(crt, key)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", kf.where(crtName), err)
		}
		return ca, nil
	}
	if !errors.Is(err1, fs.ErrNotExist) && err1 != nil {
		return nil, fmt.Errorf("read %s: %w", kf.where(crtName), err1)
	}
	ca, err := pki.NewCA(cn, caValidity)
	if err != nil {
		return nil, err
	}
	kb, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := kf.write(keyName, kb, 0o600); err != nil {
		return nil, err
	}
	if err := kf.write(crtName, ca.CertPEM(), 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

func loadOrCreateKeys(kf keyFiles, serverName string, ips []net.IP) (*keys, error) {
	k := &keys{}
	var err error
	if k.servingCA, err = loadOrCreateCA(kf, "serving-ca", "bcgw serving CA"); err != nil {
		return nil, err
	}
	if k.nodeCA, err = loadOrCreateCA(kf, "node-ca", "bcgw node CA"); err != nil {
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

	if k.joinSigning, err = loadOrCreateKey(kf, joinSigningFile); err != nil {
		return nil, err
	}
	if k.signingSPKI, err = x509.MarshalPKIXPublicKey(k.joinSigning.Public()); err != nil {
		return nil, fmt.Errorf("marshal join signing key: %w", err)
	}

	if k.workload, err = loadOrCreateKey(kf, workloadSigningFile); err != nil {
		return nil, err
	}

	if b, err := kf.read(joinEncryptionFile); err == nil {
		var jwk jose.JSONWebKey
		if err := json.Unmarshal(b, &jwk); err != nil || jwk.IsPublic() {
			return nil, fmt.Errorf("load %s: not a private JWK", kf.where(joinEncryptionFile))
		}
		k.encJWK = &jwk
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", kf.where(joinEncryptionFile), err)
	} else {
		jwk, err := pki.GenerateEncryptionJWK()
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(jwk)
		if err != nil {
			return nil, fmt.Errorf("marshal join encryption key: %w", err)
		}
		if err := kf.write(joinEncryptionFile, b, 0o600); err != nil {
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

// loadOrCreateKey reads a P-256 key (PKCS#8 PEM) called name, or makes
// and stores one (0600).
func loadOrCreateKey(kf keyFiles, name string) (crypto.Signer, error) {
	b, err := kf.read(name)
	if err == nil {
		k, err := pki.ParsePrivateKeyPEM(b)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", kf.where(name), err)
		}
		return k, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", kf.where(name), err)
	}
	key, err := pki.GenerateKey()
	if err != nil {
		return nil, err
	}
	kb, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, err
	}
	if err := kf.write(name, kb, 0o600); err != nil {
		return nil, err
	}
	return key, nil
}
