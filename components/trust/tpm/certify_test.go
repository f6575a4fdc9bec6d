package tpm

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"strings"
	"testing"
)

func qualifying(t *testing.T) [QualifyingDataSize]byte {
	t.Helper()
	var q [QualifyingDataSize]byte
	if _, err := rand.Read(q[:]); err != nil {
		t.Fatal(err)
	}
	return q
}

func TestCertify(t *testing.T) {
	tp := openSWTPM(t)
	ak, err := tp.AK()
	if err != nil {
		t.Fatal(err)
	}
	a := nodeKey(t, tp, unique(1))
	b := nodeKey(t, tp, unique(2))
	q := qualifying(t)
	attest, sig, err := tp.Certify(a, ak, q)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyCertify(ak.PublicArea(), attest, sig, a.PublicArea(), q); err != nil {
		t.Fatalf("a genuine certification: %v", err)
	}
	at, err := ParseAttest(attest)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(at.ExtraData, q[:]) || !bytes.Equal(at.Name, a.Name()) {
		t.Fatalf("attestation %+v", at)
	}

	refused := func(what string, err error, want string) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: verified", what)
		} else if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", what, err, want)
		}
	}
	// The AK certified key A, not key B.
	refused("certification of A checked against B",
		VerifyCertify(ak.PublicArea(), attest, sig, b.PublicArea(), q), "certifies another key")
	// Other qualifying data (another CSR, a replayed challenge).
	other := q
	other[0] ^= 1
	refused("other qualifying data", VerifyCertify(ak.PublicArea(), attest, sig, a.PublicArea(), other), "other qualifying data")
	// Any changed byte of the attestation or the signature.
	for i := range attest {
		bad := bytes.Clone(attest)
		bad[i] ^= 0x01
		if VerifyCertify(ak.PublicArea(), bad, sig, a.PublicArea(), q) == nil {
			t.Fatalf("attestation with byte %d flipped verified", i)
		}
	}
	for i := range sig {
		bad := bytes.Clone(sig)
		bad[i] ^= 0x01
		if VerifyCertify(ak.PublicArea(), attest, bad, a.PublicArea(), q) == nil {
			t.Fatalf("signature with byte %d flipped verified", i)
		}
	}
	// Another TPM's AK did not sign it.
	otherAK, err := openSWTPM(t).AK()
	if err != nil {
		t.Fatal(err)
	}
	refused("another TPM's AK", VerifyCertify(otherAK.PublicArea(), attest, sig, a.PublicArea(), q), "does not match")
	// A node key is no AK.
	refused("a node key as the AK", VerifyCertify(a.PublicArea(), attest, sig, a.PublicArea(), q), "not a bcd AK")
	// The AK is no node key.
	refused("the AK as the certified key", VerifyCertify(ak.PublicArea(), attest, sig, ak.PublicArea(), q), "not a bcd node key")
}

// An unrestricted key can sign anything, including a TPMS_ATTEST made up to
// name any key; only a restricted AK's signature counts.
func TestCertifyForgedWithUnrestrictedKey(t *testing.T) {
	tp := openSWTPM(t)
	ak, err := tp.AK()
	if err != nil {
		t.Fatal(err)
	}
	a := nodeKey(t, tp, unique(1))
	victim := nodeKey(t, tp, unique(2))
	q := qualifying(t)
	attest, _, err := tp.Certify(a, ak, q)
	if err != nil {
		t.Fatal(err)
	}
	at, err := ParseAttest(attest)
	if err != nil {
		t.Fatal(err)
	}
	// Rewrite the certified name to the victim's and sign with key A.
	forged := bytes.Replace(attest, at.Name, victim.Name(), 1)
	d := sha256.Sum256(forged)
	der, err := a.Sign(nil, d[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	sig := tpmtSignature(t, der)
	if err := VerifyCertify(a.PublicArea(), forged, sig, victim.PublicArea(), q); err == nil || !strings.Contains(err.Error(), "not a bcd AK") {
		t.Fatalf("a certification signed by an unrestricted key: %v", err)
	}
	if err := VerifyCertify(ak.PublicArea(), forged, sig, victim.PublicArea(), q); err == nil {
		t.Fatal("a forged certification verified under the AK")
	}
}

func TestCertifyRefusesWrongKeys(t *testing.T) {
	tp := openSWTPM(t)
	ak, err := tp.AK()
	if err != nil {
		t.Fatal(err)
	}
	a := nodeKey(t, tp, unique(1))
	var q [QualifyingDataSize]byte
	if _, _, err := tp.Certify(ak, a, q); err == nil {
		t.Fatal("a node key certified the AK")
	}
	if _, _, err := tp.Certify(a, a, q); err == nil {
		t.Fatal("a node key certified itself")
	}
	other := openSWTPM(t)
	if _, _, err := other.Certify(a, ak, q); err == nil {
		t.Fatal("another TPM certified this TPM's keys")
	}
}
