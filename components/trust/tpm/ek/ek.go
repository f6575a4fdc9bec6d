// Package ek is a TPM's endorsement key as bcd join uses it: the EK and its
// certificate (Endorsement.EK), credential activation (ActivateCredential),
// and the verifier's side, done without a TPM (PublicKey, MakeCredential,
// Name). It talks to the TPM through components/trust/tpm's Exec with
// go-tpm's commands, sessions and marshalling, which the tpm package
// itself does not link (bcd helper does not need them). See docs/tpm.md.
package ek

import (
	"crypto"
	"crypto/rand"
	"encoding/asn1"
	"errors"
	"fmt"

	"sync"

	"github.com/better-compute/bcd/components/trust/tpm"
	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
)

// NV indices of the TCG EK Credential Profile (low range).
const (
	nvRSAEKCert     = 0x01c00002
	nvRSAEKNonce    = 0x01c00003
	nvRSAEKTemplate = 0x01c00004
	nvECCEKCert     = 0x01c0000a
	nvECCEKNonce    = 0x01c0000b
	nvECCEKTemplate = 0x01c0000c
)

// nvChunk is how much one TPM2_NV_Read asks for; every TPM's
// TPM_PT_NV_BUFFER_MAX is at least this.
const nvChunk = 512

// maxNVSize bounds what is read from one NV index.
const maxNVSize = 16 << 10

// EK is the TPM's endorsement key as the TPM derives it, and its
// certificate when the TPM holds one.
type EK struct {
	// Public is the EK's TPMT_PUBLIC; MakeCredential encrypts to it.
	Public []byte
	// Key is its public key (*ecdsa.PublicKey or *rsa.PublicKey).
	Key crypto.PublicKey
	// Cert is the EK certificate (DER) read from NV, nil when there is none.
	// When it parses, its key is the EK's.
	Cert []byte
	// CertIndex is the NV index Cert came from (0x01c0000a for ECC,
	// 0x01c00002 for RSA), 0 when there is none.
	CertIndex uint32
}

// Endorsement is a TPM's EK: chosen on first use (see EK) and remembered.
// Its methods are safe for concurrent use.
type Endorsement struct {
	t *tpm.TPM

	mu     sync.Mutex
	obj    *tpm.Object // nil until chosen
	policy bool        // its template has an authPolicy
	cert   []byte
	idx    uint32
}

// New is t's endorsement key.
func New(t *tpm.TPM) *Endorsement { return &Endorsement{t: t} }

// EK derives the endorsement key and reads its certificate. It is the ECC
// P-256 EK when the TPM holds an ECC EK certificate or none at all, else the
// RSA-2048 EK its RSA certificate names. The template is the TCG default
// (low range) unless the TPM holds an EK template or nonce in NV.
func (e *Endorsement) EK() (*EK, error) {
	obj, err := e.object()
	if err != nil {
		return nil, err
	}
	pubArea, err := e.t.Public(obj)
	if err != nil {
		return nil, err
	}
	p, err := parsePublic(pubArea)
	if err != nil {
		return nil, fmt.Errorf("TPM2_CreatePrimary(endorsement, EK template) answered %w", err)
	}
	key, err := tpm2.Pub(*p)
	if err != nil {
		return nil, fmt.Errorf("TPM2_CreatePrimary(endorsement, EK template) answered an unusable key: %w", err)
	}
	ek := &EK{Public: pubArea, Key: key}
	e.mu.Lock()
	ek.Cert, ek.CertIndex = append([]byte(nil), e.cert...), e.idx
	e.mu.Unlock()
	// Whether the certificate is for this key is the verifier's check
	// (components/trust/tpm/ekcert; nodetpm checks it too): parsing certificates
	// here would link crypto/x509 into every user of the TPM.
	return ek, nil
}

// object picks the EK (see EK) once and remembers it.
func (e *Endorsement) object() (*tpm.Object, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.obj != nil {
		return e.obj, nil
	}
	var obj *tpm.Object
	err := e.t.Exec(func(tr tpm.Transport) error {
		eccCert, err := readNV(tr, nvECCEKCert)
		if err != nil {
			return err
		}
		var rsaCert []byte
		if eccCert == nil {
			if rsaCert, err = readNV(tr, nvRSAEKCert); err != nil {
				return err
			}
		}
		tmpl, nonceIdx, tmplIdx, cert, idx := tpm2.ECCEKTemplate, nvECCEKNonce, nvECCEKTemplate, eccCert, uint32(nvECCEKCert)
		if eccCert == nil && rsaCert != nil {
			tmpl, nonceIdx, tmplIdx, cert, idx = tpm2.RSAEKTemplate, nvRSAEKNonce, nvRSAEKTemplate, rsaCert, nvRSAEKCert
		}
		if cert == nil {
			idx = 0
		}
		b, err := readNV(tr, uint32(tmplIdx))
		if err != nil {
			return err
		}
		if b != nil {
			p, err := parsePublic(b)
			if err != nil {
				return fmt.Errorf("EK template at NV %#x: %w", tmplIdx, err)
			}
			tmpl = *p
		}
		nonce, err := readNV(tr, uint32(nonceIdx))
		if err != nil {
			return err
		}
		if nonce != nil {
			if tmpl.Unique, err = uniqueWithNonce(tmpl, nonce); err != nil {
				return fmt.Errorf("EK nonce at NV %#x: %w", nonceIdx, err)
			}
		}
		if cert != nil {
			// Some TPMs pad the NV area after the certificate.
			var raw asn1.RawValue
			if rest, err := asn1.Unmarshal(cert, &raw); err == nil {
				cert = cert[:len(cert)-len(rest)]
			}
		}
		obj = tpm.NewObject("EK template", tpm.RHEndorsement, tpm2.Marshal(tmpl))
		e.policy = len(tmpl.AuthPolicy.Buffer) != 0
		e.cert, e.idx = cert, idx
		return nil
	})
	if err != nil {
		return nil, err
	}
	e.obj = obj
	return obj, nil
}

// uniqueWithNonce fills the EK template's unique field with the NV nonce
// padded with zeros: unique.rsa to 256 bytes, unique.ecc.x to 32 bytes with
// a 32-byte zero y.
func uniqueWithNonce(tmpl tpm2.TPMTPublic, nonce []byte) (tpm2.TPMUPublicID, error) {
	switch tmpl.Type {
	case tpm2.TPMAlgRSA:
		if len(nonce) > 256 {
			return tpm2.TPMUPublicID{}, fmt.Errorf("%d bytes, at most 256", len(nonce))
		}
		buf := make([]byte, 256)
		copy(buf, nonce)
		return tpm2.NewTPMUPublicID(tpm2.TPMAlgRSA, &tpm2.TPM2BPublicKeyRSA{Buffer: buf}), nil
	case tpm2.TPMAlgECC:
		if len(nonce) > 32 {
			return tpm2.TPMUPublicID{}, fmt.Errorf("%d bytes, at most 32", len(nonce))
		}
		x := make([]byte, 32)
		copy(x, nonce)
		return tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: x},
			Y: tpm2.TPM2BECCParameter{Buffer: make([]byte, 32)},
		}), nil
	}
	return tpm2.TPMUPublicID{}, fmt.Errorf("EK template of type %#x", uint16(tmpl.Type))
}

// readNV reads a whole NV index with its own (empty) authorization;
// nil when the index is not defined.
func readNV(tr transport.TPM, idx uint32) ([]byte, error) {
	h := tpm2.TPMHandle(idx)
	pubRsp, err := tpm2.NVReadPublic{NVIndex: h}.Execute(tr)
	if err != nil {
		if errors.Is(err, tpm2.TPMRCHandle) {
			return nil, nil
		}
		return nil, fmt.Errorf("TPM2_NV_ReadPublic(%#x) = %w", idx, err)
	}
	pub, err := pubRsp.NVPublic.Contents()
	if err != nil {
		return nil, fmt.Errorf("TPM2_NV_ReadPublic(%#x) answered %w", idx, err)
	}
	size := int(pub.DataSize)
	if size > maxNVSize {
		return nil, fmt.Errorf("NV index %#x holds %d bytes, more than %d", idx, size, maxNVSize)
	}
	out := make([]byte, 0, size)
	for len(out) < size {
		n := min(size-len(out), nvChunk)
		rsp, err := tpm2.NVRead{
			AuthHandle: tpm2.AuthHandle{Handle: h, Name: pubRsp.NVName, Auth: tpm2.PasswordAuth(nil)},
			NVIndex:    tpm2.NamedHandle{Handle: h, Name: pubRsp.NVName},
			Size:       uint16(n),
			Offset:     uint16(len(out)),
		}.Execute(tr)
		if err != nil {
			return nil, fmt.Errorf("TPM2_NV_Read(%#x, %d bytes at %d) = %w", idx, n, len(out), err)
		}
		if len(rsp.Data.Buffer) != n {
			return nil, fmt.Errorf("TPM2_NV_Read(%#x, %d bytes at %d) answered %d bytes", idx, n, len(out), len(rsp.Data.Buffer))
		}
		out = append(out, rsp.Data.Buffer...)
	}
	return out, nil
}

// MakeCredential is the verifier's half of credential activation, done
// without a TPM: it checks that akPub is a bcd AK (tpm.CheckAKPublic) and
// encrypts secret (at most 32 bytes) to the EK whose TPMT_PUBLIC is ekPub,
// bound to the AK's name. Only the TPM holding that EK, with that AK loaded,
// recovers secret (ActivateCredential).
func MakeCredential(ekPub, akPub, secret []byte) (credBlob, encSecret []byte, err error) {
	if len(secret) == 0 || len(secret) > 32 {
		return nil, nil, fmt.Errorf("make credential: secret is %d bytes, want 1 to 32", len(secret))
	}
	if _, err := tpm.CheckAKPublic(akPub); err != nil {
		return nil, nil, fmt.Errorf("make credential: %w", err)
	}
	name, err := Name(akPub)
	if err != nil {
		return nil, nil, fmt.Errorf("make credential: AK %w", err)
	}
	p, err := parsePublic(ekPub)
	if err != nil {
		return nil, nil, fmt.Errorf("make credential: EK %w", err)
	}
	if !p.ObjectAttributes.Restricted || !p.ObjectAttributes.Decrypt || p.ObjectAttributes.SignEncrypt || !p.ObjectAttributes.FixedTPM {
		return nil, nil, errors.New("make credential: the EK is not a restricted decryption key fixed to its TPM")
	}
	ek, err := tpm2.ImportEncapsulationKey(p)
	if err != nil {
		return nil, nil, fmt.Errorf("make credential: EK %w", err)
	}
	credBlob, encSecret, err = tpm2.CreateCredential(rand.Reader, ek, name, secret)
	if err != nil {
		return nil, nil, fmt.Errorf("make credential: %w", err)
	}
	return credBlob, encSecret, nil
}

// ActivateCredential is the TPM's half of credential activation: the EK
// decrypts what MakeCredential made for ak's name and answers the secret.
// It fails unless the credential was made for this TPM's EK and this AK.
func (e *Endorsement) ActivateCredential(ak *tpm.Key, credBlob, encSecret []byte) ([]byte, error) {
	if ak == nil || !ak.IsAK() {
		return nil, errors.New("TPM2_ActivateCredential: activate a credential for this TPM's AK")
	}
	obj, err := e.object()
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	policy := e.policy
	e.mu.Unlock()
	var secret []byte
	err = e.t.ExecLoaded(ak, obj, func(tr tpm.Transport, ah, eh uint32, aName, eName []byte) error {
		// The default EK templates authorize use only by
		// TPM2_PolicySecret(TPM_RH_ENDORSEMENT).
		ekAuth := tpm2.Policy(tpm2.TPMAlgSHA256, 16, func(tr transport.TPM, h tpm2.TPMISHPolicy, nonceTPM tpm2.TPM2BNonce) error {
			_, err := tpm2.PolicySecret{
				AuthHandle:    tpm2.AuthHandle{Handle: tpm2.TPMRHEndorsement, Auth: tpm2.PasswordAuth(nil)},
				PolicySession: h,
				NonceTPM:      nonceTPM,
			}.Execute(tr)
			return err
		})
		if !policy {
			ekAuth = tpm2.PasswordAuth(nil)
		}
		rsp, err := tpm2.ActivateCredential{
			ActivateHandle: tpm2.AuthHandle{Handle: tpm2.TPMHandle(ah), Name: tpm2.TPM2BName{Buffer: aName}, Auth: tpm2.PasswordAuth(nil)},
			KeyHandle:      tpm2.AuthHandle{Handle: tpm2.TPMHandle(eh), Name: tpm2.TPM2BName{Buffer: eName}, Auth: ekAuth},
			CredentialBlob: tpm2.TPM2BIDObject{Buffer: credBlob},
			Secret:         tpm2.TPM2BEncryptedSecret{Buffer: encSecret},
		}.Execute(tr)
		if err != nil {
			return fmt.Errorf("TPM2_ActivateCredential(AK, EK) = %w", err)
		}
		secret = append([]byte(nil), rsp.CertInfo.Buffer...)
		return nil
	})
	return secret, err
}
