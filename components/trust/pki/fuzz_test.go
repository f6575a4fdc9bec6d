package pki

import (
	"encoding/base64"
	"strings"
	"testing"
)

func FuzzParsePin(f *testing.F) {
	valid := mustPin(f, mustKey(f).Public())
	for _, s := range []string{valid, "", "sha256/", "sha256/====", "sha1/" + valid[7:], valid + "=", strings.ToUpper(valid)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParsePin(s)
		if err != nil {
			if body := strings.TrimPrefix(s, "sha256/"); len(body) > 8 && strings.Contains(err.Error(), body) {
				t.Fatalf("error echoes input: %v", err)
			}
			return
		}
		if got := "sha256/" + base64.StdEncoding.EncodeToString(d[:]); got != s {
			t.Fatalf("accepted non-canonical pin %q (canonical %q)", s, got)
		}
	})
}

func FuzzOpenToken(f *testing.F) {
	k := mustJWK(f)
	pub := PublicJWK(k)
	sealed, err := SealToken(&pub, SealedToken{Token: "fuzz-token", CSRSHA256: "00", IssuedAt: 1})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sealed)
	f.Add("")
	f.Add("....")
	f.Add("a.b.c.d.e")
	f.Add(sealed[:len(sealed)/2])
	f.Add(strings.Replace(sealed, ".", "..", 1))
	f.Fuzz(func(t *testing.T, compact string) {
		got, err := OpenToken(k, compact)
		if err == nil && got.Token == "" {
			t.Fatal("opened a token with an empty token field")
		}
	})
}

func FuzzParseCSR(f *testing.F) {
	der, err := CreateCSR(mustKey(f), "fuzz")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(der)
	f.Add([]byte{})
	f.Add([]byte{0x30, 0x00})
	f.Add(der[:len(der)/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		csr, err := ParseCSR(b)
		if err != nil {
			return
		}
		if _, err := p256Public(csr.PublicKey); err != nil {
			t.Fatalf("accepted CSR with non-P-256 key: %v", err)
		}
		if err := csr.CheckSignature(); err != nil {
			t.Fatalf("accepted CSR with bad signature: %v", err)
		}
	})
}
