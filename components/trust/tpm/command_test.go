package tpm

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/asn1"
	"encoding/binary"
	"errors"
	"math/big"
	mrand "math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"
)

// TestTemplateBytesMatchGoTPM: the templates the node key and the AK are
// derived from, written by hand, are the bytes go-tpm marshals; a byte
// off would derive other keys than every node already has.
func TestTemplateBytesMatchGoTPM(t *testing.T) {
	u := unique(7)
	for _, c := range []struct {
		name string
		got  []byte
		want tpm2.TPMTPublic
	}{
		{"node key", NodeKeyTemplate(u), eccSigningTemplate(false, u[:])},
		{"AK", AKTemplate(), eccSigningTemplate(true, akUnique())},
		{"node key, empty unique", eccSigningTemplateBytes(false, nil), eccSigningTemplate(false, nil)},
	} {
		if want := tpm2.Marshal(c.want); !bytes.Equal(c.got, want) {
			t.Errorf("%s template:\n got %x\nwant %x", c.name, c.got, want)
		}
	}
}

// recorder is a transport that records the command go-tpm sends and
// answers TPM_RC_FAILURE, so Execute returns without a response to parse.
type recorder struct{ cmd []byte }

func (r *recorder) Send(cmd []byte) ([]byte, error) {
	r.cmd = append([]byte(nil), cmd...)
	return []byte{0x80, 0x01, 0, 0, 0, 10, 0, 0, 0x01, 0x01}, nil
}

// TestCommandsMatchGoTPM: each command framed by hand is byte for byte
// the one go-tpm's Execute sends for the same arguments.
func TestCommandsMatchGoTPM(t *testing.T) {
	u := unique(3)
	tmpl := eccSigningTemplate(false, u[:])
	digest := sha256.Sum256([]byte("message"))
	q := bytes.Repeat([]byte{0x5a}, QualifyingDataSize)
	const h1, h2 = tpm2.TPMHandle(0x80000001), tpm2.TPMHandle(0x80000002)
	name := tpm2.TPM2BName{Buffer: sha256Name(tpm2.Marshal(tmpl))}
	for _, c := range []struct {
		name string
		mine []byte
		run  func(tr *recorder) error
	}{
		{"CreatePrimary", createPrimaryCmd(RHOwner, NodeKeyTemplate(u)), func(tr *recorder) error {
			_, err := tpm2.CreatePrimary{
				PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
				InPublic:      tpm2.New2B(tmpl),
			}.Execute(tr)
			return err
		}},
		{"FlushContext", flushContextCmd(uint32(h1)), func(tr *recorder) error {
			_, err := tpm2.FlushContext{FlushHandle: h1}.Execute(tr)
			return err
		}},
		{"Sign", signCmd(uint32(h1), digest[:]), func(tr *recorder) error {
			_, err := tpm2.Sign{
				KeyHandle: tpm2.AuthHandle{Handle: h1, Name: name, Auth: tpm2.PasswordAuth(nil)},
				Digest:    tpm2.TPM2BDigest{Buffer: digest[:]},
				InScheme:  tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
				Validation: tpm2.TPMTTKHashCheck{
					Tag:       tpm2.TPMSTHashCheck,
					Hierarchy: tpm2.TPMRHNull,
				},
			}.Execute(tr)
			return err
		}},
		{"Certify", certifyCmd(uint32(h1), uint32(h2), q), func(tr *recorder) error {
			_, err := tpm2.Certify{
				ObjectHandle:   tpm2.AuthHandle{Handle: h1, Name: name, Auth: tpm2.PasswordAuth(nil)},
				SignHandle:     tpm2.AuthHandle{Handle: h2, Name: name, Auth: tpm2.PasswordAuth(nil)},
				QualifyingData: tpm2.TPM2BData{Buffer: q},
				InScheme:       tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
			}.Execute(tr)
			return err
		}},
	} {
		tr := &recorder{}
		if err := c.run(tr); !errors.Is(err, tpm2.TPMRCFailure) {
			t.Fatalf("%s through go-tpm = %v, want the recorder's TPM_RC_FAILURE", c.name, err)
		}
		if !bytes.Equal(c.mine, tr.cmd) {
			t.Errorf("%s:\n mine  %x\ngo-tpm %x", c.name, c.mine, tr.cmd)
		}
	}
}

// pwAuth is one password session's response authorization.
var pwAuth = []byte{0, 0, 1, 0, 0}

func response(tag uint16, rc uint32, body ...[]byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, tag)
	b = append(b, 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint32(b, rc)
	for _, p := range body {
		b = append(b, p...)
	}
	binary.BigEndian.PutUint32(b[2:], uint32(len(b)))
	return b
}

func TestParseResponse(t *testing.T) {
	params := []byte{0, 2, 0xaa, 0xbb}
	withParams := append(binary.BigEndian.AppendUint32(nil, uint32(len(params))), params...)
	handle := []byte{0x80, 0, 0, 1}
	ok := response(stSessions, 0, handle, withParams, pwAuth)
	h, p, err := parseResponse(ok, 1, 1)
	if err != nil || len(h) != 1 || h[0] != 0x80000001 || !bytes.Equal(p, params) {
		t.Fatalf("parseResponse(ok) = %x, %x, %v", h, p, err)
	}
	if _, p, err := parseResponse(response(stNoSessions, 0), 0, 0); err != nil || len(p) != 0 {
		t.Fatalf("parseResponse(FlushContext's answer) = %x, %v", p, err)
	}

	_, _, err = parseResponse(response(stNoSessions, uint32(tpm2.TPMRCObjectMemory)), 1, 1)
	if !errors.Is(err, errObjectMemory) || !strings.HasPrefix(err.Error(), "TPM_RC_OBJECT_MEMORY") {
		t.Errorf("a failing response code = %v, want TPM_RC_OBJECT_MEMORY", err)
	}
	short := bytes.Clone(ok[:len(ok)-1])
	binary.BigEndian.PutUint32(short[2:], uint32(len(short)))
	for _, c := range []struct {
		name, want string
		rsp        []byte
	}{
		{"empty", "truncated", nil},
		{"size other than length", "its header says", ok[:len(ok)-1]},
		{"truncated auth", "truncated", short},
		{"trailing", "trailing", response(stSessions, 0, handle, withParams, pwAuth, []byte{0})},
		{"non-empty hmac", "not empty", response(stSessions, 0, handle, withParams, []byte{0, 0, 1, 0, 1, 7})},
		{"no continueSession", "not empty", response(stSessions, 0, handle, withParams, []byte{0, 0, 0, 0, 0})},
		{"parameters beyond the end", "truncated", response(stSessions, 0, handle, []byte{0, 0, 1, 0}, pwAuth)},
		{"no-sessions tag to a command with sessions", "tag", response(stNoSessions, 0, handle, withParams)},
	} {
		if _, _, err := parseResponse(c.rsp, 1, 1); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: parseResponse = %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// TestCheckTemplateRefuses: a public area that differs from the template
// anywhere but the unique point, or whose point is malformed, is refused,
// and a node key is not an AK nor the other way round.
func TestCheckTemplateRefuses(t *testing.T) {
	key := testNodeKeyPublic(t)
	if _, err := CheckNodeKeyPublic(key); err != nil {
		t.Fatalf("CheckNodeKeyPublic(a node key) = %v", err)
	}
	if _, err := CheckAKPublic(key); err == nil || !strings.Contains(err.Error(), "differ from the template") {
		t.Errorf("CheckAKPublic(a node key) = %v", err)
	}
	for i := range len(key) - 68 { // every byte before the unique point
		b := bytes.Clone(key)
		b[i] ^= 0x01
		if _, err := CheckNodeKeyPublic(b); err == nil {
			t.Errorf("byte %d changed: accepted", i)
		}
	}
	for _, c := range []struct {
		name string
		pub  []byte
		want string
	}{
		{"truncated", key[:len(key)-1], "truncated"},
		{"trailing", append(bytes.Clone(key), 0), "trailing"},
		{"off the curve", append(bytes.Clone(key[:len(key)-1]), key[len(key)-1]^1), "unique point"},
		{"short x", append(append(bytes.Clone(key[:len(key)-68]), 0, 0), key[len(key)-34:]...), "0 and 32 bytes"},
		{"empty", nil, "differ from the template"},
	} {
		if _, err := CheckNodeKeyPublic(c.pub); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: CheckNodeKeyPublic = %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// testNodeKeyPublic is a node key's public area with a real P-256 point,
// made without a TPM.
func testNodeKeyPublic(t testing.TB) []byte {
	t.Helper()
	// The P-256 base point.
	x := []byte{0x6b, 0x17, 0xd1, 0xf2, 0xe1, 0x2c, 0x42, 0x47, 0xf8, 0xbc, 0xe6, 0xe5, 0x63, 0xa4, 0x40, 0xf2, 0x77, 0x03, 0x7d, 0x81, 0x2d, 0xeb, 0x33, 0xa0, 0xf4, 0xa1, 0x39, 0x45, 0xd8, 0x98, 0xc2, 0x96}
	y := []byte{0x4f, 0xe3, 0x42, 0xe2, 0xfe, 0x1a, 0x7f, 0x9b, 0x8e, 0xe7, 0xeb, 0x4a, 0x7c, 0x0f, 0x9e, 0x16, 0x2b, 0xce, 0x33, 0x57, 0x6b, 0x31, 0x5e, 0xce, 0xcb, 0xb6, 0x40, 0x68, 0x37, 0xbf, 0x51, 0xf5}
	tmpl := eccSigningTemplate(false, x)
	tmpl.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
		X: tpm2.TPM2BECCParameter{Buffer: x},
		Y: tpm2.TPM2BECCParameter{Buffer: y},
	})
	return tpm2.Marshal(tmpl)
}

// FuzzParseResponse: no response bytes make the frame parser or the
// CreatePrimary and Certify parameter parsers panic.
func FuzzParseResponse(f *testing.F) {
	f.Add(response(stSessions, 0, []byte{0x80, 0, 0, 1}, []byte{0, 0, 0, 4, 0, 2, 1, 2}, pwAuth), 1, 1)
	f.Add(response(stNoSessions, 0), 0, 0)
	f.Add(response(stNoSessions, 0x902), 1, 1)
	f.Fuzz(func(t *testing.T, rsp []byte, nHandles, nAuths int) {
		nHandles, nAuths = nHandles&1, nAuths&3
		h, p, err := parseResponse(rsp, nHandles, nAuths)
		if err != nil {
			return
		}
		if nHandles == 1 {
			_, _ = parseCreatePrimary(h, p)
		}
		_, _ = CheckNodeKeyPublic(p)
	})
}

// FuzzCheckNodeKeyPublic: the byte check accepts exactly what go-tpm's
// decoder and a re-encoding accepted before (parse, put the unique into the
// template, compare), and never panics.
func FuzzCheckNodeKeyPublic(f *testing.F) {
	f.Add(testNodeKeyPublic(f))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, pub []byte) {
		_, err := CheckNodeKeyPublic(pub)
		if old := oldCheckTemplate(pub, eccSigningTemplate(false, nil)); (err == nil) != (old == nil) {
			t.Fatalf("CheckNodeKeyPublic(%x) = %v, the go-tpm check = %v", pub, err, old)
		}
	})
}

// oldCheckTemplate is the check made with go-tpm before checkTemplate.
func oldCheckTemplate(pub []byte, tmpl tpm2.TPMTPublic) error {
	p, err := parsePublic(pub)
	if err != nil {
		return err
	}
	tmpl.Unique = p.Unique
	if string(tpm2.Marshal(tmpl)) != string(pub) {
		return errors.New("differ")
	}
	pt, err := p.Unique.ECC()
	if err != nil {
		return err
	}
	if len(pt.X.Buffer) != 32 || len(pt.Y.Buffer) != 32 {
		return errors.New("size")
	}
	_, err = ecdsaPublic(pt.X.Buffer, pt.Y.Buffer)
	return err
}

// eccSigningTemplate is the node key's (restricted false) and the AK's
// template as go-tpm's structure, as the package built it before it wrote
// the bytes itself (eccSigningTemplateBytes).
func eccSigningTemplate(restricted bool, x []byte) tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type:    tpm2.TPMAlgECC,
		NameAlg: tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{
			FixedTPM:            true,
			FixedParent:         true,
			SensitiveDataOrigin: true,
			UserWithAuth:        true,
			NoDA:                true,
			Restricted:          restricted,
			SignEncrypt:         true,
		},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
			Scheme: tpm2.TPMTECCScheme{
				Scheme: tpm2.TPMAlgECDSA,
				Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA,
					&tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256}),
			},
			CurveID: tpm2.TPMECCNistP256,
			KDF:     tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: x},
			Y: tpm2.TPM2BECCParameter{Buffer: nil},
		}),
	}
}

// parsePublic decodes a TPMT_PUBLIC with go-tpm; it must re-encode to pub.
func parsePublic(pub []byte) (*tpm2.TPMTPublic, error) {
	p, err := tpm2.Unmarshal[tpm2.TPMTPublic](pub)
	if err != nil {
		return nil, err
	}
	if string(tpm2.Marshal(p)) != string(pub) {
		return nil, errors.New("non-canonical")
	}
	return p, nil
}

// TestECDSADERMatchesASN1: ecdsaDER writes what encoding/asn1 marshals for
// the same r and s, including zero, leading zero bytes and a high bit set,
// and a real signature re-encoded verifies.
func TestECDSADERMatchesASN1(t *testing.T) {
	cases := [][2][]byte{
		{{0}, {0}},
		{{1}, {0x7f}},
		{{0x80}, {0xff, 0xff}},
		{{0, 0, 0x80, 1}, {0, 1}},
		{bytes.Repeat([]byte{0xff}, 32), bytes.Repeat([]byte{0x7f}, 32)},
		{nil, {0x80}},
	}
	for range 200 {
		r, s := make([]byte, 32), make([]byte, 32)
		rand.Read(r)
		rand.Read(s)
		r[0] &= byte(mrand.IntN(256)) // sometimes leading zeros
		cases = append(cases, [2][]byte{r, s})
	}
	for _, c := range cases {
		want, err := asn1.Marshal(struct{ R, S *big.Int }{new(big.Int).SetBytes(c[0]), new(big.Int).SetBytes(c[1])})
		if err != nil {
			t.Fatal(err)
		}
		if got := ecdsaDER(c[0], c[1]); !bytes.Equal(got, want) {
			t.Errorf("r %x s %x:\n got %x\nwant %x", c[0], c[1], got, want)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	d := sha256.Sum256([]byte("m"))
	r, s, err := ecdsa.Sign(rand.Reader, key, d[:])
	if err != nil {
		t.Fatal(err)
	}
	if !ecdsa.VerifyASN1(&key.PublicKey, d[:], ecdsaDER(r.Bytes(), s.Bytes())) {
		t.Error("a signature re-encoded by ecdsaDER does not verify")
	}
}
