package tpm

import (
	"crypto"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/pki"
)

func TestEKPublicKey(t *testing.T) {
	tp := openSWTPM(t)
	ek, err := tp.EK()
	if err != nil {
		t.Fatal(err)
	}
	k, err := EKPublicKey(ek.Public)
	if err != nil {
		t.Fatalf("the EK: %v", err)
	}
	if pk, ok := k.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pk.Equal(ek.Key) {
		t.Error("EKPublicKey answered another key than the EK's")
	}
	ak, err := tp.AK()
	if err != nil {
		t.Fatal(err)
	}
	nk, err := tp.NodeKey([UniqueSize]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"the AK (a signing key)": ak.PublicArea(),
		"a node key":             nk.PublicArea(),
		"trailing bytes":         append(append([]byte(nil), ek.Public...), 0),
		"truncated":              ek.Public[:len(ek.Public)-1],
		"nothing":                nil,
	} {
		if _, err := EKPublicKey(b); err == nil {
			t.Errorf("%s passed as an EK", name)
		}
	}
}

func TestVerifyEKCertificate(t *testing.T) {
	state := setupEKCerts(t)
	caPEM, err := os.ReadFile(filepath.Join(filepath.Dir(state), "ca", "issuercert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("swtpm's local CA certificate does not parse")
	}
	tp := startSWTPM(t, state).open(t)
	ek, err := tp.EK()
	if err != nil || ek.Cert == nil {
		t.Fatalf("EK with certificate: %v", err)
	}
	if err := VerifyEKCertificate(ek.Cert, ek.Public, roots, nil); err != nil {
		t.Fatalf("the swtpm EK certificate under its CA: %v", err)
	}
	other, _ := pki.NewCA("another EK CA", time.Hour)
	otherRoots := x509.NewCertPool()
	otherRoots.AddCert(other.Cert)
	if err := VerifyEKCertificate(ek.Cert, ek.Public, otherRoots, nil); err == nil {
		t.Error("the EK certificate verified under another CA")
	}
	// The certificate of this EK presented with another TPM's EK.
	ek2, err := openSWTPM(t).EK()
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyEKCertificate(ek.Cert, ek2.Public, roots, nil); err == nil || !strings.Contains(err.Error(), "another key") {
		t.Errorf("a certificate for another EK: %v", err)
	}
	if err := VerifyEKCertificate([]byte("not a certificate"), ek.Public, roots, nil); err == nil {
		t.Error("garbage verified as an EK certificate")
	}
}

// FuzzEKPublicKey: a public area EKPublicKey accepts re-encodes to itself
// (parsePublic is exact) and names a key.
func FuzzEKPublicKey(f *testing.F) {
	f.Add([]byte{0x00, 0x23, 0x00, 0x0b})
	f.Add([]byte{0x00, 0x01, 0x00, 0x0b, 0x00, 0x03, 0x00, 0xb2})
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := EKPublicKey(b)
		if err == nil && k == nil {
			t.Fatal("accepted with no key")
		}
	})
}
