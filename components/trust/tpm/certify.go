package tpm

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// QualifyingDataSize is the size of the qualifying data a certification
// carries (for a renewal, sha256 of the CSR).
const QualifyingDataSize = 32

const (
	// generatedValue is TPM_GENERATED_VALUE, the magic that starts every
	// structure a TPM attests. A restricted key never signs a digest of
	// anything else that starts with it.
	generatedValue = 0xff544347
	// stAttestCertify is TPM_ST_ATTEST_CERTIFY.
	stAttestCertify = 0x8017
	// maxNameSize bounds TPM2B_NAME and TPM2B_DATA: a 2-byte algorithm and a
	// SHA-512 digest.
	maxNameSize = 2 + 64
	algECDSA    = 0x0018
	algSHA256   = 0x000b
)

// Certify has ak certify key with TPM2_Certify over qualifyingData. It
// returns the TPMS_ATTEST the TPM made and the AK's signature over it (a
// TPMT_SIGNATURE), both as the TPM answered them; VerifyCertify checks them.
func (t *TPM) Certify(key, ak *Key, qualifyingData [QualifyingDataSize]byte) (attest, sig []byte, err error) {
	if key == nil || ak == nil || key.t != t || ak.t != t {
		return nil, nil, errors.New("TPM2_Certify: the key and the AK must come from this TPM")
	}
	if key.ak || !ak.ak {
		return nil, nil, errors.New("TPM2_Certify: certify a node key with the AK")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ks, as, err := t.loadPairLocked(key.obj, ak.obj)
	if err != nil {
		return nil, nil, err
	}
	attest, sig, err = t.certify(ks.handle, as.handle, qualifyingData[:])
	if err != nil {
		return nil, nil, fmt.Errorf("TPM2_Certify(node key, AK) = %w", err)
	}
	if err := VerifyCertify(ak.obj.public, attest, sig, key.obj.public, qualifyingData); err != nil {
		return nil, nil, fmt.Errorf("TPM2_Certify(node key, AK) answered a certification that does not verify: %w", err)
	}
	return attest, sig, nil
}

// loadPairLocked loads a and b and checks that loading b left a loaded.
func (t *TPM) loadPairLocked(a, b *object) (*slot, *slot, error) {
	as, err := t.loadLocked(a)
	if err != nil {
		return nil, nil, err
	}
	bs, err := t.loadLocked(b)
	if err != nil {
		return nil, nil, err
	}
	for _, s := range t.loaded {
		if s == as {
			return as, bs, nil
		}
	}
	return nil, nil, fmt.Errorf("the TPM cannot hold the %s and the %s loaded at once", a.what, b.what)
}

// Attest is a parsed TPMS_ATTEST of type TPM_ST_ATTEST_CERTIFY.
type Attest struct {
	// QualifiedSigner is the qualified name of the key that signed.
	QualifiedSigner []byte
	// ExtraData is the qualifying data the caller gave TPM2_Certify.
	ExtraData []byte
	// Clock, ResetCount, RestartCount and Safe are the TPM's clock info.
	Clock        uint64
	ResetCount   uint32
	RestartCount uint32
	Safe         bool
	// FirmwareVersion is the TPM vendor's firmware version.
	FirmwareVersion uint64
	// Name and QualifiedName are the certified object's.
	Name          []byte
	QualifiedName []byte
}

// ParseAttest parses a TPMS_ATTEST that certifies an object
// (TPM_ST_ATTEST_CERTIFY) and starts with TPM_GENERATED_VALUE. It does not
// check a signature: see VerifyCertify.
func ParseAttest(b []byte) (*Attest, error) {
	r := reader{b: b}
	magic := r.u32()
	typ := r.u16()
	if r.err != nil {
		return nil, fmt.Errorf("parse TPMS_ATTEST: %w", r.err)
	}
	if magic != generatedValue {
		return nil, fmt.Errorf("parse TPMS_ATTEST: magic is %#08x, want TPM_GENERATED_VALUE %#08x", magic, generatedValue)
	}
	if typ != stAttestCertify {
		return nil, fmt.Errorf("parse TPMS_ATTEST: type is %#04x, want TPM_ST_ATTEST_CERTIFY %#04x", typ, stAttestCertify)
	}
	a := &Attest{
		QualifiedSigner: r.tpm2b(maxNameSize, "qualifiedSigner"),
		ExtraData:       r.tpm2b(maxNameSize, "extraData"),
		Clock:           r.u64(),
		ResetCount:      r.u32(),
		RestartCount:    r.u32(),
	}
	switch safe := r.u8(); safe {
	case 0, 1:
		a.Safe = safe == 1
	default:
		r.fail(fmt.Errorf("clockInfo.safe is %d, want 0 or 1", safe))
	}
	a.FirmwareVersion = r.u64()
	a.Name = r.tpm2b(maxNameSize, "attested.certify.name")
	a.QualifiedName = r.tpm2b(maxNameSize, "attested.certify.qualifiedName")
	if r.err == nil && len(r.b) != 0 {
		r.fail(fmt.Errorf("%d trailing bytes", len(r.b)))
	}
	if r.err != nil {
		return nil, fmt.Errorf("parse TPMS_ATTEST: %w", r.err)
	}
	return a, nil
}

// VerifyCertify checks, without a TPM, a certification made by Certify:
// akPub (TPMT_PUBLIC) is a bcd AK (CheckAKPublic), sig is its ECDSA-SHA256
// signature over attest, attest is a TPMS_ATTEST of type CERTIFY that the
// TPM generated, carrying qualifyingData, and certifying the object whose
// name is that of keyPub (TPMT_PUBLIC), which is a bcd node key
// (CheckNodeKeyPublic): fixed to the TPM and generated inside it.
func VerifyCertify(akPub, attest, sig, keyPub []byte, qualifyingData [QualifyingDataSize]byte) error {
	ak, err := CheckAKPublic(akPub)
	if err != nil {
		return fmt.Errorf("verify certification: %w", err)
	}
	if _, err := CheckNodeKeyPublic(keyPub); err != nil {
		return fmt.Errorf("verify certification: %w", err)
	}
	r, s, err := parseECDSASignature(sig)
	if err != nil {
		return fmt.Errorf("verify certification: %w", err)
	}
	d := sha256.Sum256(attest)
	if !ecdsa.VerifyASN1(ak, d[:], ecdsaDER(r, s)) {
		return errors.New("verify certification: the AK's signature does not match the attestation")
	}
	a, err := ParseAttest(attest)
	if err != nil {
		return fmt.Errorf("verify certification: %w", err)
	}
	if !bytes.Equal(a.ExtraData, qualifyingData[:]) {
		return errors.New("verify certification: the attestation carries other qualifying data")
	}
	if !bytes.Equal(a.Name, sha256Name(keyPub)) { // keyPub is a node key: its name algorithm is SHA-256
		return errors.New("verify certification: the attestation certifies another key")
	}
	return nil
}

// parseECDSASignature parses a TPMT_SIGNATURE that must be ECDSA with
// SHA-256 and returns r and s (big-endian, at most 32 bytes each).
func parseECDSASignature(b []byte) (r, s []byte, err error) {
	rd := reader{b: b}
	alg, hash := rd.u16(), rd.u16()
	rb := rd.tpm2b(32, "signatureR")
	sb := rd.tpm2b(32, "signatureS")
	if rd.err == nil && len(rd.b) != 0 {
		rd.fail(fmt.Errorf("%d trailing bytes", len(rd.b)))
	}
	if rd.err != nil {
		return nil, nil, fmt.Errorf("parse TPMT_SIGNATURE: %w", rd.err)
	}
	if alg != algECDSA || hash != algSHA256 {
		return nil, nil, fmt.Errorf("parse TPMT_SIGNATURE: algorithm %#04x with hash %#04x, want ECDSA (%#04x) with SHA-256 (%#04x)",
			alg, hash, algECDSA, algSHA256)
	}
	return rb, sb, nil
}

// reader decodes big-endian TPM structures; the first error sticks and
// later reads return zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.b = nil
}

func (r *reader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.fail(fmt.Errorf("truncated %s: %d bytes left, want %d", what, len(r.b), n))
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() uint8 {
	if v := r.take(1, "byte"); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if v := r.take(2, "uint16"); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if v := r.take(4, "uint32"); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if v := r.take(8, "uint64"); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// tpm2b reads a size-prefixed buffer of at most max bytes.
func (r *reader) tpm2b(max int, what string) []byte {
	n := int(r.u16())
	if r.err != nil {
		return nil
	}
	if n > max {
		r.fail(fmt.Errorf("%s is %d bytes, at most %d allowed", what, n, max))
		return nil
	}
	v := r.take(n, what)
	if v == nil {
		return nil
	}
	return append([]byte{}, v...)
}
