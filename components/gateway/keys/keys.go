package keys

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

// Set is the gateway's long-lived keys, made on first start and kept in
// the data directory (0600), or in the database sealed (shared.go).
type Set struct {
	ServingCA   *pki.CA
	NodeCA      *pki.CA
	Serving     tls.Certificate
	JoinSigning crypto.Signer
	SigningSPKI []byte
	EncJWK      *jose.JSONWebKey
	// workload signs workload tokens (JWTs for an audience), a key of its
	// own: a token holder learns nothing of the keys agents pin.
	Workload crypto.Signer
}

const caValidity = 10 * 365 * 24 * time.Hour

func loadOrCreateCA(kf Files, name, cn string) (*pki.CA, error) {
	crtName, keyName := name+".crt", name+".key"
	crt, err1 := kf.Read(crtName)
	key, err2 := kf.Read(keyName)
	if err1 == nil && err2 == nil {
		ca, err := pki.LoadCA(crt, key)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", kf.Where(crtName), err)
		}
		return ca, nil
	}
	if !errors.Is(err1, fs.ErrNotExist) && err1 != nil {
		return nil, fmt.Errorf("read %s: %w", kf.Where(crtName), err1)
	}
	ca, err := pki.NewCA(cn, caValidity)
	if err != nil {
		return nil, err
	}
	kb, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := kf.Write(keyName, kb, 0o600); err != nil {
		return nil, err
	}
	if err := kf.Write(crtName, ca.CertPEM(), 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

func LoadOrCreate(kf Files, serverName string, ips []net.IP) (*Set, error) {
	k := &Set{}
	var err error
	if k.ServingCA, err = loadOrCreateCA(kf, "serving-ca", "bcgw serving CA"); err != nil {
		return nil, err
	}
	if k.NodeCA, err = loadOrCreateCA(kf, "node-ca", "bcgw node CA"); err != nil {
		return nil, err
	}
	// The serving leaf is issued anew at every start for the names asked.
	if k.Serving, err = k.IssueServing(serverName, ips); err != nil {
		return nil, err
	}

	if k.JoinSigning, err = LoadOrCreateKey(kf, joinSigningFile); err != nil {
		return nil, err
	}
	if k.SigningSPKI, err = x509.MarshalPKIXPublicKey(k.JoinSigning.Public()); err != nil {
		return nil, fmt.Errorf("marshal join signing key: %w", err)
	}

	if k.Workload, err = LoadOrCreateKey(kf, workloadSigningFile); err != nil {
		return nil, err
	}

	if b, err := kf.Read(joinEncryptionFile); err == nil {
		var jwk jose.JSONWebKey
		if err := json.Unmarshal(b, &jwk); err != nil || jwk.IsPublic() {
			return nil, fmt.Errorf("load %s: not a private JWK", kf.Where(joinEncryptionFile))
		}
		k.EncJWK = &jwk
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", kf.Where(joinEncryptionFile), err)
	} else {
		jwk, err := pki.GenerateEncryptionJWK()
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(jwk)
		if err != nil {
			return nil, fmt.Errorf("marshal join encryption key: %w", err)
		}
		if err := kf.Write(joinEncryptionFile, b, 0o600); err != nil {
			return nil, err
		}
		k.EncJWK = jwk
	}
	return k, nil
}

// Pins are the well-known document's pins of the serving CA, the join
// signing key and the join encryption key.
func (k *Set) Pins() (serving, signing, encryption string, err error) {
	serving = pki.PinOfCert(k.ServingCA.Cert)
	if signing, err = pki.Pin(k.JoinSigning.Public()); err != nil {
		return
	}
	encryption, err = pki.JWKPin(k.EncJWK)
	return
}

// LoadOrCreateKey reads a P-256 key (PKCS#8 PEM) called name, or makes
// and stores one (0600).
func LoadOrCreateKey(kf Files, name string) (crypto.Signer, error) {
	b, err := kf.Read(name)
	if err == nil {
		k, err := pki.ParsePrivateKeyPEM(b)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", kf.Where(name), err)
		}
		return k, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", kf.Where(name), err)
	}
	key, err := pki.GenerateKey()
	if err != nil {
		return nil, err
	}
	kb, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, err
	}
	if err := kf.Write(name, kb, 0o600); err != nil {
		return nil, err
	}
	return key, nil
}

// ServingLifetime is how long a serving leaf is valid.
const ServingLifetime = 30 * 24 * time.Hour

// IssueServing issues a new serving leaf (a new key) under the serving
// CA for serverName, localhost and ips: at every start, and when the
// gateway renews it while it runs. Agents pin the CA, so a new leaf needs
// nothing of them.
func (k *Set) IssueServing(serverName string, ips []net.IP) (tls.Certificate, error) {
	leafKey, err := pki.GenerateKey()
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := k.ServingCA.IssueServer(leafKey.Public(), []string{serverName, "localhost"}, ips, ServingLifetime)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("issue serving certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{leaf.Raw, k.ServingCA.Cert.Raw}, PrivateKey: leafKey, Leaf: leaf}, nil
}
