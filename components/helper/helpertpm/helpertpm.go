// Package helpertpm is the host's TPM as an unprivileged bcd node uses it:
// through bcd helper's tpm.* operations (tpm.nodekey, tpm.sign, tpm.ak,
// tpm.certify, tpm.release), since a node under [helper] never opens
// /dev/tpmrm0 itself. It offers what renewal and the identity need of a
// TPM (renew.TPM: NodeKey, NewNodeKey, AKPublic, Certify), as
// components/trust/tpm/nodetpm does for a node running as root.
//
// The node trusts none of the helper's answers: a node key's public area
// must be the node-key template's with a P-256 point
// (tpm.CheckNodeKeyPublic), every signature must verify against that
// public key, the AK must be a bcd AK (tpm.CheckAKPublic) and every
// certification must verify under the AK the helper announced first
// (tpm.VerifyCertify).
package helpertpm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/trust/tpm"
)

// Timeout bounds each call to the helper.
const Timeout = 30 * time.Second

// TPM is the helper's TPM. Its methods are safe for concurrent use.
type TPM struct {
	c *helperclient.Client

	mu    sync.Mutex
	akPub []byte // the AK the helper announced first (tpm.ak), checked
}

// New uses the helper c talks to.
func New(c *helperclient.Client) *TPM { return &TPM{c: c} }

// String names where the TPM is.
func (h *TPM) String() string { return "the TPM through bcd helper at " + h.c.Socket }

// Close does nothing: the helper holds the keys, at most 8, and unloads
// the least recently used.
func (h *TPM) Close() error { return nil }

// Key is a node key the helper holds: a crypto.Signer that knows its
// unique and its checked public area.
type Key struct {
	h      *TPM
	unique [tpm.UniqueSize]byte
	public []byte // TPMT_PUBLIC, a node key's (checked)
	pub    *ecdsa.PublicKey
}

// Public answers the key's public half, an *ecdsa.PublicKey on P-256.
func (k *Key) Public() crypto.PublicKey { return k.pub }

// TPMUnique is the 32-byte unique node.key records for this key.
func (k *Key) TPMUnique() [tpm.UniqueSize]byte { return k.unique }

// PublicArea answers the key's TPMT_PUBLIC as the helper answered it.
func (k *Key) PublicArea() []byte { return bytes.Clone(k.public) }

func ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), Timeout)
}

// NodeKey has the helper derive the node key named by unique and checks
// its public area is a node key's.
func (h *TPM) NodeKey(unique [tpm.UniqueSize]byte) (crypto.Signer, error) {
	public, pub, err := h.nodeKey(unique)
	if err != nil {
		return nil, err
	}
	return &Key{h: h, unique: unique, public: public, pub: pub}, nil
}

func (h *TPM) nodeKey(unique [tpm.UniqueSize]byte) ([]byte, *ecdsa.PublicKey, error) {
	c, cancel := ctx()
	defer cancel()
	public, err := h.c.TPMNodeKey(c, unique[:])
	if err != nil {
		return nil, nil, err
	}
	pub, err := tpm.CheckNodeKeyPublic(public)
	if err != nil {
		return nil, nil, fmt.Errorf("bcd helper: tpm.nodekey answered a public area that is %w", err)
	}
	return public, pub, nil
}

// NewNodeKey makes a node key under a new random unique.
func (h *TPM) NewNodeKey() (crypto.Signer, error) {
	u, err := tpm.NewUnique()
	if err != nil {
		return nil, err
	}
	return h.NodeKey(u)
}

// AKPublic answers the AK's TPMT_PUBLIC: the one the helper announced
// first, which must be a bcd AK. Certifications must verify under it.
func (h *TPM) AKPublic() ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.akPub == nil {
		c, cancel := ctx()
		defer cancel()
		ak, err := h.c.TPMAK(c)
		if err != nil {
			return nil, err
		}
		if _, err := tpm.CheckAKPublic(ak); err != nil {
			return nil, fmt.Errorf("bcd helper: tpm.ak answered a public area that is %w", err)
		}
		h.akPub = ak
	}
	return bytes.Clone(h.akPub), nil
}

// Certify has the helper's AK certify key (a node key of this TPM) over
// qualifyingData and checks the certification under the AK the helper
// announced. It answers the key's TPMT_PUBLIC, the TPMS_ATTEST and the
// AK's TPMT_SIGNATURE.
func (h *TPM) Certify(key crypto.Signer, qualifyingData [tpm.QualifyingDataSize]byte) (keyPub, attest, sig []byte, err error) {
	k, ok := key.(*Key)
	if !ok || k.h != h {
		return nil, nil, nil, errors.New("tpm.certify: the key is not a node key of this TPM")
	}
	ak, err := h.AKPublic()
	if err != nil {
		return nil, nil, nil, err
	}
	var signedBy []byte
	err = k.retry(func(c context.Context) error {
		var err error
		attest, sig, signedBy, err = h.c.TPMCertify(c, k.unique[:], qualifyingData[:])
		return err
	})
	if err != nil {
		return nil, nil, nil, err
	}
	if !bytes.Equal(signedBy, ak) {
		return nil, nil, nil, errors.New("bcd helper: tpm.certify answered a certification by another AK than the one it announced")
	}
	if err := tpm.VerifyCertify(ak, attest, sig, k.public, qualifyingData); err != nil {
		return nil, nil, nil, fmt.Errorf("bcd helper: tpm.certify answered a certification that does not verify: %w", err)
	}
	return k.PublicArea(), attest, sig, nil
}

// Sign has the helper sign digest, a SHA-256, -384 or -512 digest (32, 48
// or 64 bytes; when opts names a hash its size must match), and answers
// the ASN.1 DER ECDSA signature once it verifies against the key. rand is
// not used.
func (k *Key) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	switch len(digest) {
	case 32, 48, 64:
	default:
		return nil, fmt.Errorf("tpm.sign: digest is %d bytes, want 32, 48 or 64 (SHA-256, -384, -512)", len(digest))
	}
	if opts != nil {
		if hf := opts.HashFunc(); hf == 0 {
			return nil, errors.New("tpm.sign: the message is not hashed; the node key signs digests only")
		} else if hf.Size() != len(digest) {
			return nil, fmt.Errorf("tpm.sign: digest is %d bytes, but %s digests are %d", len(digest), hf, hf.Size())
		}
	}
	var sig []byte
	err := k.retry(func(c context.Context) error {
		var err error
		sig, err = k.h.c.TPMSign(c, k.unique[:], digest)
		return err
	})
	if err != nil {
		return nil, err
	}
	if !ecdsa.VerifyASN1(k.pub, digest, sig) {
		return nil, errors.New("bcd helper: tpm.sign answered a signature that does not verify against the node key")
	}
	return sig, nil
}

// Release has the helper unload the key; it is loaded again at its next
// use. A key the helper does not hold is released already.
func (k *Key) Release() error {
	c, cancel := ctx()
	defer cancel()
	if err := k.h.c.TPMRelease(c, k.unique[:]); err != nil && !helperclient.IsNotLoaded(err) {
		return err
	}
	return nil
}

// retry runs call; when the helper holds no key for the unique (it
// restarted, unloaded it as the least recently used, or it was
// released), it loads the key again with tpm.nodekey, which must answer
// the same public area, and runs call once more.
func (k *Key) retry(call func(context.Context) error) error {
	c, cancel := ctx()
	err := call(c)
	cancel()
	if !helperclient.IsNotLoaded(err) {
		return err
	}
	public, _, err := k.h.nodeKey(k.unique)
	if err != nil {
		return err
	}
	if !bytes.Equal(public, k.public) {
		return errors.New("bcd helper: tpm.nodekey now derives another key for this unique than before (was the TPM cleared?)")
	}
	c, cancel = ctx()
	defer cancel()
	return call(c)
}
