package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"strings"
	"testing"
)

func mustKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := GenerateKey()
	if err != nil {
		t.Fatalf("GenerateKey: %v", err)
	}
	return k
}

func mustP384(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatalf("generate P-384: %v", err)
	}
	return k
}

func mustEd25519(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatalf("generate ed25519: %v", err)
	}
	return k
}

func pkcs8PEM(t *testing.T, k any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatalf("MarshalPKCS8PrivateKey: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func TestGenerateKey(t *testing.T) {
	k := mustKey(t)
	if k.Curve != elliptic.P256() {
		t.Fatalf("curve = %s, want P-256", k.Curve.Params().Name)
	}
	k2 := mustKey(t)
	if k.Equal(k2) {
		t.Fatal("two generated keys are equal")
	}
}

func TestMarshalPrivateKeyPEM(t *testing.T) {
	tests := []struct {
		name    string
		key     crypto.Signer
		wantErr string
	}{
		{name: "p256", key: mustKey(t)},
		{name: "p384", key: mustP384(t), wantErr: "P-256"},
		{name: "ed25519", key: mustEd25519(t), wantErr: "want ECDSA P-256"},
		{name: "nil", key: nil, wantErr: "want ECDSA P-256"},
		{name: "nil ecdsa", key: (*ecdsa.PrivateKey)(nil), wantErr: "want ECDSA P-256"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := MarshalPrivateKeyPEM(tc.key)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("MarshalPrivateKeyPEM: %v", err)
			}
			if !strings.HasPrefix(string(b), "-----BEGIN PRIVATE KEY-----") {
				t.Fatalf("PEM does not start with PRIVATE KEY header: %.40q", b)
			}
			got, err := ParsePrivateKeyPEM(b)
			if err != nil {
				t.Fatalf("ParsePrivateKeyPEM: %v", err)
			}
			if !tc.key.(*ecdsa.PrivateKey).Equal(got) {
				t.Fatal("round-tripped key differs")
			}
		})
	}
}

func TestParsePrivateKeyPEM(t *testing.T) {
	k := mustKey(t)
	sec1, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	secret := base64.StdEncoding.EncodeToString(k.D.Bytes())
	tests := []struct {
		name    string
		in      []byte
		wantErr string
	}{
		{name: "valid", in: pkcs8PEM(t, k)},
		{name: "valid with leading text", in: append([]byte("comment\n"), pkcs8PEM(t, k)...)},
		{name: "empty", in: nil, wantErr: "no PEM block"},
		{name: "not pem", in: []byte("hello"), wantErr: "no PEM block"},
		{name: "sec1 block", in: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}), wantErr: `"EC PRIVATE KEY"`},
		{name: "sec1 der in pkcs8 block", in: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: sec1}), wantErr: "parse PKCS#8"},
		{name: "garbage der", in: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}}), wantErr: "parse PKCS#8"},
		{name: "ed25519", in: pkcs8PEM(t, mustEd25519(t)), wantErr: "ed25519.PrivateKey, want ECDSA P-256"},
		{name: "p384", in: pkcs8PEM(t, mustP384(t)), wantErr: "curve P-384, want P-256"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePrivateKeyPEM(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), secret) {
					t.Fatal("error contains private key material")
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePrivateKeyPEM: %v", err)
			}
			if !k.Equal(got) {
				t.Fatal("parsed key differs")
			}
		})
	}
}
