package identity

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/asn1"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// What holds the node key (Agent.KeyHolder), as bcd status and bcd doctor
// say it.
const (
	KeyInFile = "a file"
	KeyInTPM  = "in the TPM"
)

// TPMUniqueSize is the size of the unique that names a node key in the TPM.
const TPMUniqueSize = 32

// TPM derives node keys held in the host's TPM (components/trust/tpm/nodetpm).
type TPM interface {
	// NodeKey derives the node key named by unique; the same unique gives
	// the same key on the same TPM.
	NodeKey(unique [TPMUniqueSize]byte) (crypto.Signer, error)
}

// TPMKey is a node key held in the TPM: Save records its unique, not the key.
type TPMKey interface {
	crypto.Signer
	TPMUnique() [TPMUniqueSize]byte
}

// tpmRecord is node.key for a key in the TPM:
//
//	{"tpm":{"unique":"<base64 of 32 bytes>","public_key":"<base64 DER SPKI>"}}
//
// The unique names the key (the TPM derives it again from it); the public
// key lets Load match the certificate without the TPM. Neither is secret.
type tpmRecord struct {
	unique [TPMUniqueSize]byte
	pub    *ecdsa.PublicKey
}

type tpmRecordJSON struct {
	TPM *struct {
		Unique    []byte `json:"unique"`
		PublicKey []byte `json:"public_key"`
	} `json:"tpm"`
}

// maxRecordSize bounds node.key as a TPM record.
const maxRecordSize = 4 << 10

// isTPMRecord tells a TPM record (JSON) from a PEM key.
func isTPMRecord(b []byte) bool {
	return bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{"))
}

// parseTPMRecord decodes a TPM record strictly: known fields only, one
// object, a 32-byte unique and a P-256 public key.
func parseTPMRecord(b []byte) (*tpmRecord, error) {
	if len(b) > maxRecordSize {
		return nil, fmt.Errorf("TPM key record is %d bytes, at most %d", len(b), maxRecordSize)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var j tpmRecordJSON
	if err := dec.Decode(&j); err != nil {
		return nil, fmt.Errorf("TPM key record: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("TPM key record: trailing data")
	}
	if j.TPM == nil {
		return nil, errors.New("TPM key record: no tpm object")
	}
	if len(j.TPM.Unique) != TPMUniqueSize {
		return nil, fmt.Errorf("TPM key record: unique is %d bytes, want %d", len(j.TPM.Unique), TPMUniqueSize)
	}
	pk, err := x509.ParsePKIXPublicKey(j.TPM.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("TPM key record: public_key: %w", err)
	}
	ep, ok := pk.(*ecdsa.PublicKey)
	if !ok || ep.Curve.Params().Name != "P-256" {
		return nil, errors.New("TPM key record: public_key is not ECDSA P-256")
	}
	r := &tpmRecord{pub: ep}
	copy(r.unique[:], j.TPM.Unique)
	return r, nil
}

func marshalTPMRecord(k TPMKey) ([]byte, error) {
	spki, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		return nil, fmt.Errorf("record the TPM key: %w", err)
	}
	u := k.TPMUnique()
	var j tpmRecordJSON
	j.TPM = &struct {
		Unique    []byte `json:"unique"`
		PublicKey []byte `json:"public_key"`
	}{Unique: u[:], PublicKey: spki}
	b, err := json.Marshal(j)
	if err != nil {
		return nil, fmt.Errorf("record the TPM key: %w", err)
	}
	return append(b, '\n'), nil
}

// absentTPMKey stands for a key in the TPM when the TPM was not opened
// (Load): it answers the public key and refuses to sign.
type absentTPMKey struct{ pub *ecdsa.PublicKey }

func (k absentTPMKey) Public() crypto.PublicKey { return k.pub }

func (k absentTPMKey) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, errors.New("the node key is in the TPM, which this process has not opened")
}

// OIDTPMAK is the certificate extension in which bcgw names the AK that
// certified a node's key (a tpm join and every renewal after it): an OCTET
// STRING holding the AK's TPM name (0x000b and the SHA-256 of its
// TPMT_PUBLIC). The OID is a private placeholder, 2.25 and a random 31-bit
// number: Go's certificate parser takes only arcs below 2^31, so a whole UUID
// (X.667) cannot be used. Move it under a registered enterprise arc when
// bcd has one.
var OIDTPMAK = asn1.ObjectIdentifier{2, 25, 1732923023}

// CertAK returns the AK name a certificate names, nil when it names none.
func CertAK(c *x509.Certificate) ([]byte, error) {
	for _, e := range c.Extensions {
		if !e.Id.Equal(OIDTPMAK) {
			continue
		}
		var name []byte
		rest, err := asn1.Unmarshal(e.Value, &name)
		if err != nil || len(rest) != 0 {
			return nil, errors.New("certificate: the AK extension is not one OCTET STRING")
		}
		if len(name) != 34 || name[0] != 0x00 || name[1] != 0x0b {
			return nil, errors.New("certificate: the AK extension is not a SHA-256 TPM name")
		}
		return name, nil
	}
	return nil, nil
}
