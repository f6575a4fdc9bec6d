package es256

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"
)

// MarshalSPKI writes what crypto/x509 writes, and ParseSPKI takes it
// back; other keys and other encodings are refused.
func TestSPKI(t *testing.T) {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	want, _ := x509.MarshalPKIXPublicKey(k.Public())
	got, err := MarshalSPKI(k.Public())
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("MarshalSPKI = %x, %v; x509 writes %x", got, err, want)
	}
	pub, err := ParseSPKI(want)
	if err != nil || !pub.Equal(k.Public()) {
		t.Fatalf("ParseSPKI: %v", err)
	}
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	for name, der := range map[string][]byte{
		"P-384":    must(x509.MarshalPKIXPublicKey(p384.Public())),
		"ed25519":  must(x509.MarshalPKIXPublicKey(edPub)),
		"trailing": append(bytes.Clone(want), 0),
		"short":    want[:len(want)-1],
		"empty":    nil,
	} {
		if _, err := ParseSPKI(der); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	if _, err := MarshalSPKI(p384.Public()); err == nil {
		t.Error("MarshalSPKI of a P-384 key")
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func FuzzParseSPKI(f *testing.F) {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(k.Public())
	f.Add(der)
	f.Fuzz(func(t *testing.T, b []byte) {
		pub, err := ParseSPKI(b)
		if err != nil {
			return
		}
		if again, _ := MarshalSPKI(pub); !bytes.Equal(again, b) {
			t.Fatal("parsed bytes that do not marshal back")
		}
	})
}
