package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"io"
	"math/big"
	"strings"
	"testing"
)

// opaqueSigner hides the concrete key type, like a hardware-backed signer.
type opaqueSigner struct{ k *ecdsa.PrivateKey }

func (s opaqueSigner) Public() crypto.PublicKey { return s.k.Public() }
func (s opaqueSigner) Sign(r io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	return s.k.Sign(r, d, o)
}

func TestSignVerify(t *testing.T) {
	k := mustKey(t)
	other := mustKey(t)
	msg := []byte("join response body")
	sig, err := Sign(k, PurposeJoinResponse, msg)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	if len(sig) != 64 {
		t.Fatalf("signature length %d, want 64", len(sig))
	}
	opaqueSig, err := Sign(opaqueSigner{k}, PurposeRenew, msg)
	if err != nil {
		t.Fatalf("Sign with opaque signer: %v", err)
	}
	tampered := append([]byte(nil), msg...)
	tampered[0] ^= 1
	badSig := append([]byte(nil), sig...)
	badSig[10] ^= 1
	zeroSig := make([]byte, 64)

	tests := []struct {
		name    string
		pub     crypto.PublicKey
		purpose string
		msg     []byte
		sig     []byte
		wantErr string
	}{
		{name: "valid", pub: k.Public(), purpose: PurposeJoinResponse, msg: msg, sig: sig},
		{name: "opaque signer valid", pub: k.Public(), purpose: PurposeRenew, msg: msg, sig: opaqueSig},
		{name: "other purpose", pub: k.Public(), purpose: PurposeRenew, msg: msg, sig: sig, wantErr: "does not match"},
		{name: "reserved purpose", pub: k.Public(), purpose: PurposeJoinToken, msg: msg, sig: sig, wantErr: "does not match"},
		{name: "tampered msg", pub: k.Public(), purpose: PurposeJoinResponse, msg: tampered, sig: sig, wantErr: "does not match"},
		{name: "truncated msg", pub: k.Public(), purpose: PurposeJoinResponse, msg: msg[:len(msg)-1], sig: sig, wantErr: "does not match"},
		{name: "tampered sig", pub: k.Public(), purpose: PurposeJoinResponse, msg: msg, sig: badSig, wantErr: "does not match"},
		{name: "zero sig", pub: k.Public(), purpose: PurposeJoinResponse, msg: msg, sig: zeroSig, wantErr: "does not match"},
		{name: "wrong key", pub: other.Public(), purpose: PurposeJoinResponse, msg: msg, sig: sig, wantErr: "does not match"},
		{name: "short sig", pub: k.Public(), purpose: PurposeJoinResponse, msg: msg, sig: sig[:63], wantErr: "63 bytes"},
		{name: "empty purpose", pub: k.Public(), purpose: "", msg: msg, sig: sig, wantErr: "purpose is empty"},
		{name: "nul purpose", pub: k.Public(), purpose: "a\x00b", msg: msg, sig: sig, wantErr: "NUL"},
		{name: "p384 key", pub: mustP384(t).Public(), purpose: PurposeJoinResponse, msg: msg, sig: sig, wantErr: "P-384"},
		{name: "ed25519 key", pub: mustEd25519(t).Public(), purpose: PurposeJoinResponse, msg: msg, sig: sig, wantErr: "want ECDSA P-256"},
		{name: "nil key", pub: nil, purpose: PurposeJoinResponse, msg: msg, sig: sig, wantErr: "want ECDSA P-256"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Verify(tc.pub, tc.purpose, tc.msg, tc.sig)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestSignFraming(t *testing.T) {
	k := mustKey(t)
	sig, err := Sign(k, PurposeRenew, []byte("payload"))
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256([]byte("bcd-sig-v1\x00" + PurposeRenew + "\x00payload"))
	r := new(big.Int).SetBytes(sig[:32])
	s := new(big.Int).SetBytes(sig[32:])
	if !ecdsa.Verify(&k.PublicKey, h[:], r, s) {
		t.Fatal("signature is not over sha256(domain||0||purpose||0||msg)")
	}
	// Moving bytes between purpose and message must not keep a signature valid.
	if err := Verify(k.Public(), "bcd/renew/v1\x00pay", []byte("load"), sig); err == nil {
		t.Fatal("purpose with NUL accepted")
	}
	if err := Verify(k.Public(), "bcd/renew/v", []byte("1payload"), sig); err == nil {
		t.Fatal("shifted purpose/message boundary verified")
	}
}

func TestSignErrors(t *testing.T) {
	tests := []struct {
		name    string
		key     crypto.Signer
		purpose string
		wantErr string
	}{
		{name: "empty purpose", key: mustKey(t), purpose: "", wantErr: "purpose is empty"},
		{name: "nul purpose", key: mustKey(t), purpose: "x\x00", wantErr: "NUL"},
		{name: "nil key", key: nil, purpose: PurposeRenew, wantErr: "nil"},
		{name: "nil ecdsa key", key: (*ecdsa.PrivateKey)(nil), purpose: PurposeRenew, wantErr: "nil"},
		{name: "p384", key: mustP384(t), purpose: PurposeRenew, wantErr: "P-384"},
		{name: "ed25519", key: mustEd25519(t), purpose: PurposeRenew, wantErr: "want ECDSA P-256"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Sign(tc.key, tc.purpose, []byte("m"))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
			}
		})
	}
}
