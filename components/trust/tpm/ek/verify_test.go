package ek

import (
	"crypto"
	"github.com/better-compute/bcd/components/trust/tpm"
	"testing"
)

func TestPublicKey(t *testing.T) {
	tp := openSWTPM(t)
	ek, err := tp.EK()
	if err != nil {
		t.Fatal(err)
	}
	k, err := PublicKey(ek.Public)
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
	nk, err := tp.NodeKey([tpm.UniqueSize]byte{1})
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
		if _, err := PublicKey(b); err == nil {
			t.Errorf("%s passed as an EK", name)
		}
	}
}

// FuzzPublicKey: a public area EKPublicKey accepts re-encodes to itself
// (parsePublic is exact) and names a key.
func FuzzPublicKey(f *testing.F) {
	f.Add([]byte{0x00, 0x23, 0x00, 0x0b})
	f.Add([]byte{0x00, 0x01, 0x00, 0x0b, 0x00, 0x03, 0x00, 0xb2})
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := PublicKey(b)
		if err == nil && k == nil {
			t.Fatal("accepted with no key")
		}
	})
}
