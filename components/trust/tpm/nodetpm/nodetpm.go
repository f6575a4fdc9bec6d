// Package nodetpm is the host's TPM as bcd join, the identity and renewal
// use it: node keys named by the 32-byte unique node.key records, the AK's
// certification of a node key, the EK and credential activation. It wraps
// components/trust/tpm behind plain types (crypto.Signer, byte slices), so the
// packages that use it state what they need as small interfaces and do not
// link go-tpm themselves.
package nodetpm

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/better-compute/bcd/components/trust/tpm"
	"github.com/better-compute/bcd/components/trust/tpm/ek"
)

// TPM is an open TPM. Its methods are safe for concurrent use.
type TPM struct {
	t    *tpm.TPM
	ek   *ek.Endorsement
	what string // where it was opened, for errors

	mu sync.Mutex
	ak *tpm.Key
}

// Key is a node key in the TPM: a crypto.Signer that knows its unique.
type Key struct {
	*tpm.Key
	unique [tpm.UniqueSize]byte
	owner  *TPM
}

// TPMUnique is the 32-byte unique node.key records for this key.
func (k *Key) TPMUnique() [tpm.UniqueSize]byte { return k.unique }

// Open opens the TPM device at path (tpm.DefaultPath on a host).
func Open(path string) (*TPM, error) {
	t, err := tpm.Open(path)
	if err != nil {
		return nil, err
	}
	return &TPM{t: t, ek: ek.New(t), what: path}, nil
}

// OpenTCP connects to a software TPM's command port (swtpm socket
// --server type=tcp); tests and fakehw builds use it.
func OpenTCP(addr string) (*TPM, error) {
	t, err := tpm.OpenTCP(addr)
	if err != nil {
		return nil, err
	}
	return &TPM{t: t, ek: ek.New(t), what: "swtpm " + addr}, nil
}

// Present reports whether the host has a TPM device at path (it may still
// be unusable to this user).
func Present(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// String names where the TPM was opened.
func (h *TPM) String() string { return h.what }

// Close flushes every loaded key and closes the TPM.
func (h *TPM) Close() error { return h.t.Close() }

// NodeKey derives the node key named by unique.
func (h *TPM) NodeKey(unique [tpm.UniqueSize]byte) (crypto.Signer, error) {
	k, err := h.t.NodeKey(unique)
	if err != nil {
		return nil, err
	}
	return &Key{Key: k, unique: unique, owner: h}, nil
}

// NewNodeKey makes a new node key under a new random unique.
func (h *TPM) NewNodeKey() (crypto.Signer, error) {
	u, err := tpm.NewUnique()
	if err != nil {
		return nil, err
	}
	return h.NodeKey(u)
}

func (h *TPM) akKey() (*tpm.Key, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ak == nil {
		ak, err := h.t.AK()
		if err != nil {
			return nil, err
		}
		h.ak = ak
	}
	return h.ak, nil
}

// AKPublic answers the AK's TPMT_PUBLIC.
func (h *TPM) AKPublic() ([]byte, error) {
	ak, err := h.akKey()
	if err != nil {
		return nil, err
	}
	return ak.PublicArea(), nil
}

// Certify has the AK certify key (a node key of this TPM) over
// qualifyingData. It answers the key's TPMT_PUBLIC, the TPMS_ATTEST and the
// AK's TPMT_SIGNATURE.
func (h *TPM) Certify(key crypto.Signer, qualifyingData [tpm.QualifyingDataSize]byte) (keyPub, attest, sig []byte, err error) {
	k, ok := key.(*Key)
	if !ok || k.owner != h {
		return nil, nil, nil, errors.New("TPM2_Certify: the key is not a node key of this TPM")
	}
	ak, err := h.akKey()
	if err != nil {
		return nil, nil, nil, err
	}
	attest, sig, err = h.t.Certify(k.Key, ak, qualifyingData)
	if err != nil {
		return nil, nil, nil, err
	}
	return k.PublicArea(), attest, sig, nil
}

// EK answers the EK's TPMT_PUBLIC and its certificate (DER; nil when the
// TPM holds none).
func (h *TPM) EK() (pub, cert []byte, err error) {
	e, err := h.ek.EK()
	if err != nil {
		return nil, nil, err
	}
	if e.Cert != nil {
		if c, err := x509.ParseCertificate(e.Cert); err == nil {
			if pk, ok := c.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pk.Equal(e.Key) {
				return nil, nil, fmt.Errorf("the EK certificate at NV %#x is for another key than the EK the TPM derives", e.CertIndex)
			}
		}
	}
	return e.Public, e.Cert, nil
}

// EKPublicPEM answers the EK's public key as a PEM "PUBLIC KEY" block
// (SPKI), the form `bcgw tpm enroll --ek-pub` takes.
func (h *TPM) EKPublicPEM() ([]byte, error) {
	pub, _, err := h.EK()
	if err != nil {
		return nil, err
	}
	k, err := ek.PublicKey(pub)
	if err != nil {
		return nil, err
	}
	spki, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		return nil, fmt.Errorf("EK public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki}), nil
}

// ActivateCredential recovers the secret of a credential made for this TPM's
// EK and AK (ek.MakeCredential).
func (h *TPM) ActivateCredential(credBlob, encSecret []byte) ([]byte, error) {
	ak, err := h.akKey()
	if err != nil {
		return nil, err
	}
	secret, err := h.ek.ActivateCredential(ak, credBlob, encSecret)
	if err != nil {
		return nil, fmt.Errorf("answer the TPM challenge: %w", err)
	}
	return secret, nil
}
