package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"strings"
	"testing"
)

func rawCSR(t *testing.T, k crypto.Signer, alg x509.SignatureAlgorithm) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:            pkix.Name{CommonName: "raw"},
		SignatureAlgorithm: alg,
	}, k)
	if err != nil {
		t.Fatalf("CreateCertificateRequest: %v", err)
	}
	return der
}

func TestCreateCSR(t *testing.T) {
	tests := []struct {
		name    string
		key     crypto.Signer
		cn      string
		wantErr string
	}{
		{name: "p256", key: mustKey(t), cn: "node-1"},
		{name: "opaque signer", key: opaqueSigner{mustKey(t)}, cn: "node-2"},
		{name: "p384", key: mustP384(t), cn: "x", wantErr: "P-384"},
		{name: "ed25519", key: mustEd25519(t), cn: "x", wantErr: "want ECDSA P-256"},
		{name: "nil", key: nil, cn: "x", wantErr: "nil"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			der, err := CreateCSR(tc.key, tc.cn)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("CreateCSR: %v", err)
			}
			csr, err := ParseCSR(der)
			if err != nil {
				t.Fatalf("ParseCSR: %v", err)
			}
			if csr.Subject.CommonName != tc.cn {
				t.Fatalf("CN = %q, want %q", csr.Subject.CommonName, tc.cn)
			}
			if err := MatchPin(mustPin(t, tc.key.Public()), csr.PublicKey); err != nil {
				t.Fatalf("CSR key: %v", err)
			}
		})
	}
}

func mustPin(t testing.TB, pub crypto.PublicKey) string {
	t.Helper()
	p, err := Pin(pub)
	if err != nil {
		t.Fatalf("Pin: %v", err)
	}
	return p
}

func TestParseCSR(t *testing.T) {
	k := mustKey(t)
	good, err := CreateCSR(k, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	// The signature BIT STRING ends the DER; flipping its last byte breaks
	// the signature but keeps the structure parseable.
	badSig := append([]byte(nil), good...)
	badSig[len(badSig)-1] ^= 0x01
	// Flip a byte of the CN inside the signed part.
	badBody := append([]byte(nil), good...)
	i := strings.Index(string(badBody), "node-1")
	if i < 0 {
		t.Fatal("CN not found in CSR DER")
	}
	badBody[i] = 'm'

	tests := []struct {
		name    string
		der     []byte
		wantErr string
	}{
		{name: "valid", der: good},
		{name: "tampered signature", der: badSig, wantErr: "check CSR signature"},
		{name: "tampered subject", der: badBody, wantErr: "check CSR signature"},
		{name: "empty", der: nil, wantErr: "empty"},
		{name: "garbage", der: []byte{0x30, 0x03, 1, 2, 3}, wantErr: "parse CSR"},
		{name: "trailing data", der: append(append([]byte(nil), good...), 0), wantErr: "parse CSR"},
		{name: "oversize", der: make([]byte, MaxCSRSize+1), wantErr: "exceeds limit"},
		{name: "p384 key", der: rawCSR(t, mustP384(t), x509.ECDSAWithSHA384), wantErr: "P-384"},
		{name: "ed25519 key", der: rawCSR(t, mustEd25519(t), x509.PureEd25519), wantErr: "want ECDSA P-256"},
		{name: "sha384 signature", der: rawCSR(t, k, x509.ECDSAWithSHA384), wantErr: "signature algorithm"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			csr, err := ParseCSR(tc.der)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				if csr != nil {
					t.Fatal("CSR returned with error")
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseCSR: %v", err)
			}
		})
	}
}
