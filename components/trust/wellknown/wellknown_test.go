package wellknown

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/trust/pki"
)

func validDoc(t testing.TB) Document {
	t.Helper()
	priv, err := pki.GenerateEncryptionJWK()
	if err != nil {
		t.Fatal(err)
	}
	pub := pki.PublicJWK(priv)
	jb, _ := json.Marshal(pub)
	encPin, _ := pki.JWKPin(priv)
	k, _ := pki.GenerateKey()
	pin, _ := pki.Pin(k.Public())
	return Document{
		Gateway: Gateway{URL: "https://127.0.0.1:8443", ServerName: "bcgw.lab"},
		Pins:    Pins{ServingCA: pin, JoinSigning: pin, JoinEncryption: encPin},
		Join:    Join{EncryptionJWK: jb},
	}
}

func TestParse(t *testing.T) {
	other := validDoc(t)
	for _, tc := range []struct {
		name   string
		mutate func(*Document)
		want   string
	}{
		{"valid", func(*Document) {}, ""},
		{"http gateway", func(d *Document) { d.Gateway.URL = "http://gw" }, "gateway.url"},
		{"bad pin", func(d *Document) { d.Pins.JoinSigning = "sha256/xyz" }, "pins.joinSigning"},
		{"key not matching its pin", func(d *Document) { d.Join.EncryptionJWK = other.Join.EncryptionJWK }, "does not match pins.joinEncryption"},
		{"no key", func(d *Document) { d.Join.EncryptionJWK = nil }, "join.encryptionJwk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := validDoc(t)
			tc.mutate(&d)
			b, _ := json.Marshal(d)
			_, jwk, err := Parse(b)
			if tc.want == "" {
				if err != nil || jwk == nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse error %v, want one naming %q", err, tc.want)
			}
		})
	}
	if _, _, err := Parse(make([]byte, MaxSize+1)); err == nil {
		t.Fatal("an oversized document parsed")
	}
}

func FuzzParse(f *testing.F) {
	d := validDoc(f)
	b, _ := json.Marshal(d)
	f.Add(b)
	f.Add([]byte(`{"gateway":{"url":"https://x"}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _ = Parse(b)
	})
}
