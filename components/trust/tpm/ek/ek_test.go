package ek

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"strings"
	"testing"
)

func TestEKWithoutCertificate(t *testing.T) {
	tp := openSWTPM(t)
	ek, err := tp.EK()
	if err != nil {
		t.Fatal(err)
	}
	if ek.Cert != nil || ek.CertIndex != 0 {
		t.Fatalf("a fresh swtpm has an EK certificate at %#x", ek.CertIndex)
	}
	pub, ok := ek.Key.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Fatalf("EK is %T, want ECDSA P-256", ek.Key)
	}
	again, err := tp.EK()
	if err != nil || !bytes.Equal(again.Public, ek.Public) {
		t.Fatalf("EK changed: %v", err)
	}
}

func TestEKCertificate(t *testing.T) {
	// swtpm_setup certifies an RSA-2048 EK in the low range (0x01c00002)
	// and an ECC P-384 EK in the high range (0x01c00016); with no ECC
	// certificate at 0x01c0000a, EK is the certified RSA one.
	state := setupEKCerts(t)
	tp := startSWTPM(t, state).open(t)
	ek, err := tp.EK()
	if err != nil {
		t.Fatal(err)
	}
	if ek.CertIndex != nvRSAEKCert || ek.Cert == nil {
		t.Fatalf("EK certificate index %#x, want the RSA one %#x", ek.CertIndex, nvRSAEKCert)
	}
	c, err := x509.ParseCertificate(ek.Cert)
	if err != nil {
		t.Fatalf("parse the EK certificate: %v", err)
	}
	pub, ok := ek.Key.(*rsa.PublicKey)
	if !ok || pub.N.BitLen() != 2048 {
		t.Fatalf("EK is %T, want RSA-2048", ek.Key)
	}
	if !c.PublicKey.(*rsa.PublicKey).Equal(ek.Key) {
		t.Fatal("the EK certificate names another key")
	}
	// Credential activation works with the certified EK.
	ak, err := tp.AK()
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("0123456789abcdef0123456789abcdef")
	blob, enc, err := MakeCredential(ek.Public, ak.PublicArea(), secret)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tp.ActivateCredential(ak, blob, enc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, secret) {
		t.Fatalf("activated %x, want %x", got, secret)
	}
}

func TestCredentialActivation(t *testing.T) {
	tp := openSWTPM(t)
	ek, err := tp.EK()
	if err != nil {
		t.Fatal(err)
	}
	ak, err := tp.AK()
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("a challenge of thirty-two bytes!")
	blob, enc, err := MakeCredential(ek.Public, ak.PublicArea(), secret)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tp.ActivateCredential(ak, blob, enc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, secret) {
		t.Fatalf("activated %x, want %x", got, secret)
	}

	// A credential for another TPM's AK (the same template, another
	// endorsement seed) does not activate here.
	other := openSWTPM(t)
	otherAK, err := other.AK()
	if err != nil {
		t.Fatal(err)
	}
	blob2, enc2, err := MakeCredential(ek.Public, otherAK.PublicArea(), secret)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tp.ActivateCredential(ak, blob2, enc2); err == nil {
		t.Fatal("a credential for another AK activated")
	}
	// A credential made for another TPM's EK does not activate here.
	otherEK, err := other.EK()
	if err != nil {
		t.Fatal(err)
	}
	blob3, enc3, err := MakeCredential(otherEK.Public, ak.PublicArea(), secret)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tp.ActivateCredential(ak, blob3, enc3); err == nil {
		t.Fatal("a credential for another EK activated")
	}
	// A changed byte does not activate.
	bad := bytes.Clone(blob)
	bad[len(bad)-1] ^= 1
	if _, err := tp.ActivateCredential(ak, bad, enc); err == nil {
		t.Fatal("a tampered credential activated")
	}
	// MakeCredential refuses a node key as the AK, and a signing key as the EK.
	k := nodeKey(t, tp, unique(1))
	if _, _, err := MakeCredential(ek.Public, k.PublicArea(), secret); err == nil || !strings.Contains(err.Error(), "not a bcd AK") {
		t.Fatalf("credential for a node key: %v", err)
	}
	if _, _, err := MakeCredential(ak.PublicArea(), ak.PublicArea(), secret); err == nil {
		t.Fatal("credential encrypted to the AK")
	}
	if _, _, err := MakeCredential(ek.Public, ak.PublicArea(), make([]byte, 33)); err == nil {
		t.Fatal("a 33-byte secret was accepted")
	}
	// The TPM still activates after the refusals.
	if got, err := tp.ActivateCredential(ak, blob, enc); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("activate again: %v", err)
	}
}
