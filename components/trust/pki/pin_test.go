package pki

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

func TestPin(t *testing.T) {
	k := mustKey(t)
	pin, err := Pin(k.Public())
	if err != nil {
		t.Fatalf("Pin: %v", err)
	}
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(der)
	if want := "sha256/" + base64.StdEncoding.EncodeToString(sum[:]); pin != want {
		t.Fatalf("Pin = %q, want %q", pin, want)
	}
	if len(pin) != len("sha256/")+44 || !strings.HasSuffix(pin, "=") {
		t.Fatalf("Pin %q is not padded std base64 of 32 bytes", pin)
	}

	ca, err := NewCA("pin-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.IssueServer(k.Public(), []string{"gw.test"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if got := PinOfCert(leaf); got != pin {
		t.Fatalf("PinOfCert = %q, want %q", got, pin)
	}
	if got := PinOfCert(nil); got != "" {
		t.Fatalf("PinOfCert(nil) = %q, want empty", got)
	}

	tests := []struct {
		name    string
		pub     crypto.PublicKey
		wantErr bool
	}{
		{name: "p256", pub: k.Public()},
		{name: "ed25519", pub: mustEd25519(t).Public()},
		{name: "nil", pub: nil, wantErr: true},
		{name: "unsupported type", pub: "not a key", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Pin(tc.pub)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if err == nil {
				if _, err := ParsePin(p); err != nil {
					t.Fatalf("ParsePin(Pin()) = %v", err)
				}
			}
		})
	}
}

func TestParsePin(t *testing.T) {
	valid, err := Pin(mustKey(t).Public())
	if err != nil {
		t.Fatal(err)
	}
	body := strings.TrimPrefix(valid, "sha256/")
	// 32 bytes use 2 of the last data character's 6 bits for padding; 'B'
	// sets one of those bits, which strict decoding rejects.
	nonCanonical := "sha256/" + body[:42] + "B="
	tests := []struct {
		name    string
		in      string
		wantErr string
	}{
		{name: "valid", in: valid},
		{name: "empty", in: "", wantErr: "missing"},
		{name: "no prefix", in: body, wantErr: "missing"},
		{name: "sha1 prefix", in: "sha1/" + body, wantErr: "missing"},
		{name: "upper prefix", in: "SHA256/" + body, wantErr: "missing"},
		{name: "prefix only", in: "sha256/", wantErr: "0 base64 characters"},
		{name: "unpadded", in: "sha256/" + strings.TrimSuffix(body, "="), wantErr: "43 base64 characters"},
		{name: "too long", in: valid + "AAAA", wantErr: "48 base64 characters"},
		{name: "url alphabet", in: "sha256/" + strings.Repeat("_", 43) + "=", wantErr: "base64"},
		{name: "bad chars", in: "sha256/" + strings.Repeat("!", 44), wantErr: "base64"},
		{name: "non-canonical bits", in: nonCanonical, wantErr: "base64"},
		{name: "44 chars unpadded", in: "sha256/" + strings.Repeat("A", 44), wantErr: "decodes to 33 bytes"},
		{name: "embedded newline", in: "sha256/" + body[:20] + "\n" + body[21:], wantErr: "parse pin"},
		{name: "sha512 sized", in: "sha256/" + base64.StdEncoding.EncodeToString(make([]byte, 64)), wantErr: "88 base64 characters"},
		{name: "16 bytes padded to 44", in: "sha256/" + base64.StdEncoding.EncodeToString(make([]byte, 16)) + strings.Repeat("=", 20), wantErr: "base64"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePin(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				if b := strings.TrimPrefix(tc.in, "sha256/"); len(b) > 3 && strings.Contains(err.Error(), b) {
					t.Fatalf("error echoes the pin body: %v", err)
				}
				if got != ([32]byte{}) {
					t.Fatal("non-zero digest returned with error")
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePin: %v", err)
			}
			if enc := "sha256/" + base64.StdEncoding.EncodeToString(got[:]); enc != tc.in {
				t.Fatalf("re-encoded %q, want %q", enc, tc.in)
			}
		})
	}
}

func TestMatchPin(t *testing.T) {
	k := mustKey(t)
	pin, err := Pin(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		pin     string
		pub     crypto.PublicKey
		wantErr string
	}{
		{name: "match", pin: pin, pub: k.Public()},
		{name: "other key", pin: pin, pub: mustKey(t).Public(), wantErr: "key does not match pin"},
		{name: "bad pin", pin: "sha256/xyz", pub: k.Public(), wantErr: "parse pin"},
		{name: "bad key", pin: pin, pub: nil, wantErr: "marshal public key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := MatchPin(tc.pin, tc.pub)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("MatchPin: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), pin) {
				t.Fatal("error echoes the pin")
			}
		})
	}
}
