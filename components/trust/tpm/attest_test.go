package tpm

import (
	"bytes"
	"encoding/asn1"
	"encoding/binary"
	"math/big"
	"strings"
	"testing"
)

// marshalAttest encodes a as a TPMS_ATTEST of type CERTIFY.
func marshalAttest(a *Attest) []byte {
	var b []byte
	b = binary.BigEndian.AppendUint32(b, generatedValue)
	b = binary.BigEndian.AppendUint16(b, stAttestCertify)
	add2b := func(v []byte) {
		b = binary.BigEndian.AppendUint16(b, uint16(len(v)))
		b = append(b, v...)
	}
	add2b(a.QualifiedSigner)
	add2b(a.ExtraData)
	b = binary.BigEndian.AppendUint64(b, a.Clock)
	b = binary.BigEndian.AppendUint32(b, a.ResetCount)
	b = binary.BigEndian.AppendUint32(b, a.RestartCount)
	if a.Safe {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.BigEndian.AppendUint64(b, a.FirmwareVersion)
	add2b(a.Name)
	add2b(a.QualifiedName)
	return b
}

// tpmtSignature encodes an ASN.1 ECDSA signature as an ECDSA-SHA256
// TPMT_SIGNATURE.
func tpmtSignature(t testing.TB, der []byte) []byte {
	t.Helper()
	var rs struct{ R, S *big.Int }
	if _, err := asn1.Unmarshal(der, &rs); err != nil {
		t.Fatal(err)
	}
	b := []byte{0x00, 0x18, 0x00, 0x0b, 0x00, 0x20}
	b = append(b, rs.R.FillBytes(make([]byte, 32))...)
	b = append(b, 0x00, 0x20)
	return append(b, rs.S.FillBytes(make([]byte, 32))...)
}

func sampleAttest() *Attest {
	name := append([]byte{0x00, 0x0b}, bytes.Repeat([]byte{0xaa}, 32)...)
	return &Attest{
		QualifiedSigner: append([]byte{0x00, 0x0b}, bytes.Repeat([]byte{0xbb}, 32)...),
		ExtraData:       bytes.Repeat([]byte{0xcc}, 32),
		Clock:           123456,
		ResetCount:      2,
		RestartCount:    1,
		Safe:            true,
		FirmwareVersion: 0x2019102200163636,
		Name:            name,
		QualifiedName:   append([]byte{0x00, 0x0b}, bytes.Repeat([]byte{0xdd}, 32)...),
	}
}

func TestParseAttest(t *testing.T) {
	good := marshalAttest(sampleAttest())
	a, err := ParseAttest(good)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(marshalAttest(a), good) {
		t.Fatal("round trip changed the attestation")
	}
	bad := func(name string, b []byte, want string) {
		t.Helper()
		if _, err := ParseAttest(b); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", name, err, want)
		}
	}
	bad("empty", nil, "truncated")
	withMagic := bytes.Clone(good)
	withMagic[0] = 0
	bad("magic", withMagic, "TPM_GENERATED_VALUE")
	quote := bytes.Clone(good)
	binary.BigEndian.PutUint16(quote[4:], 0x8018) // TPM_ST_ATTEST_QUOTE
	bad("quote", quote, "TPM_ST_ATTEST_CERTIFY")
	bad("trailing", append(bytes.Clone(good), 0), "trailing")
	for n := range len(good) {
		if _, err := ParseAttest(good[:n]); err == nil {
			t.Fatalf("truncated to %d bytes: parsed", n)
		}
	}
	s := sampleAttest()
	s.ExtraData = make([]byte, 67)
	bad("oversized extraData", marshalAttest(s), "at most 66")
	unsafe := bytes.Clone(good)
	unsafe[6+2+34+2+32+8+4+4] = 2
	bad("safe", unsafe, "safe")
}

func TestParseECDSASignature(t *testing.T) {
	good := []byte{0x00, 0x18, 0x00, 0x0b, 0x00, 0x01, 0x05, 0x00, 0x01, 0x07}
	r, s, err := parseECDSASignature(good)
	if err != nil || !bytes.Equal(r, []byte{5}) || !bytes.Equal(s, []byte{7}) {
		t.Fatalf("parse: %v %v %v", r, s, err)
	}
	for _, b := range [][]byte{
		nil,
		good[:9],
		append(bytes.Clone(good), 0),
		{0x00, 0x14, 0x00, 0x0b, 0x00, 0x01, 0x05, 0x00, 0x01, 0x07}, // RSASSA
		{0x00, 0x18, 0x00, 0x0c, 0x00, 0x01, 0x05, 0x00, 0x01, 0x07}, // SHA-384
		append([]byte{0x00, 0x18, 0x00, 0x0b, 0x00, 0x21}, make([]byte, 33+2)...),
	} {
		if _, _, err := parseECDSASignature(b); err == nil {
			t.Errorf("%x parsed", b)
		}
	}
}

func FuzzParseAttest(f *testing.F) {
	good := marshalAttest(sampleAttest())
	f.Add(good)
	f.Add(good[:20])
	f.Add(append(bytes.Clone(good), 1, 2, 3))
	empty := marshalAttest(&Attest{})
	f.Add(empty)
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseAttest(b)
		if err != nil {
			if a != nil {
				t.Fatal("an error with an attestation")
			}
			return
		}
		// What parses is exactly what it encodes.
		if got := marshalAttest(a); !bytes.Equal(got, b) {
			t.Fatalf("round trip: %x != %x", got, b)
		}
		for _, v := range [][]byte{a.QualifiedSigner, a.ExtraData, a.Name, a.QualifiedName} {
			if len(v) > maxNameSize {
				t.Fatalf("a %d-byte field", len(v))
			}
		}
	})
}
