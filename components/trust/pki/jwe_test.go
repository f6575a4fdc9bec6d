package pki

import (
	"crypto/ecdsa"
	"encoding/json"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
)

const testToken = "bcjt_SECRET-join-token-value-7f3a9c"

func mustJWK(t testing.TB) *jose.JSONWebKey {
	t.Helper()
	k, err := GenerateEncryptionJWK()
	if err != nil {
		t.Fatalf("GenerateEncryptionJWK: %v", err)
	}
	return k
}

// rawJWE encrypts payload to pub with arbitrary algorithms and options, to
// build inputs SealToken would never produce.
func rawJWE(t *testing.T, pub *ecdsa.PublicKey, alg jose.KeyAlgorithm, enc jose.ContentEncryption, payload []byte, opts *jose.EncrypterOptions) string {
	t.Helper()
	e, err := jose.NewEncrypter(enc, jose.Recipient{Algorithm: alg, Key: pub}, opts)
	if err != nil {
		t.Fatalf("NewEncrypter: %v", err)
	}
	obj, err := e.Encrypt(payload)
	if err != nil {
		t.Fatalf("Encrypt: %v", err)
	}
	s, err := obj.CompactSerialize()
	if err != nil {
		t.Fatalf("CompactSerialize: %v", err)
	}
	return s
}

func TestGenerateEncryptionJWK(t *testing.T) {
	k := mustJWK(t)
	ek, ok := k.Key.(*ecdsa.PrivateKey)
	if !ok {
		t.Fatalf("key type %T, want *ecdsa.PrivateKey", k.Key)
	}
	if k.KeyID != mustPin(t, ek.Public()) {
		t.Fatal("KeyID is not the SPKI pin")
	}
	if k.Use != "enc" || k.Algorithm != "ECDH-ES+A256KW" {
		t.Fatalf("use %q alg %q", k.Use, k.Algorithm)
	}
	pub := PublicJWK(k)
	if !pub.IsPublic() || pub.KeyID != k.KeyID || pub.Use != "enc" || pub.Algorithm != k.Algorithm {
		t.Fatalf("PublicJWK = %+v", pub)
	}
	if p := PublicJWK(nil); p.Key != nil {
		t.Fatal("PublicJWK(nil) has a key")
	}
	for _, in := range []*jose.JSONWebKey{k, &pub} {
		p, err := JWKPin(in)
		if err != nil || p != k.KeyID {
			t.Fatalf("JWKPin = %q, %v; want %q", p, err, k.KeyID)
		}
	}
	for _, in := range []*jose.JSONWebKey{nil, {}, {Key: []byte("symmetric")}} {
		if _, err := JWKPin(in); err == nil {
			t.Fatalf("JWKPin(%v) succeeded", in)
		}
	}
}

func TestParsePublicJWK(t *testing.T) {
	k := mustJWK(t)
	pub := PublicJWK(k)
	pubJSON, err := json.Marshal(pub)
	if err != nil {
		t.Fatal(err)
	}
	privJSON, err := json.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	var privFields map[string]any
	if err := json.Unmarshal(privJSON, &privFields); err != nil {
		t.Fatal(err)
	}
	secretD, _ := privFields["d"].(string)
	if secretD == "" {
		t.Fatal("private JWK JSON has no d")
	}
	variant := func(edit func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(pubJSON, &m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	p384 := jose.JSONWebKey{Key: mustP384(t).Public(), Use: "enc"}
	p384JSON, err := json.Marshal(p384)
	if err != nil {
		t.Fatal(err)
	}
	edJSON, err := json.Marshal(jose.JSONWebKey{Key: mustEd25519(t).Public()})
	if err != nil {
		t.Fatal(err)
	}
	octJSON, err := json.Marshal(jose.JSONWebKey{Key: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		in      []byte
		wantErr string
	}{
		{name: "public", in: pubJSON},
		{name: "no use alg kid", in: variant(func(m map[string]any) { delete(m, "use"); delete(m, "alg"); delete(m, "kid") })},
		{name: "private", in: privJSON, wantErr: "private"},
		{name: "symmetric", in: octJSON, wantErr: "private or symmetric"},
		{name: "p384", in: p384JSON, wantErr: "P-384"},
		{name: "ed25519", in: edJSON, wantErr: "want ECDSA P-256"},
		{name: "use sig", in: variant(func(m map[string]any) { m["use"] = "sig" }), wantErr: "use"},
		{name: "alg ES256", in: variant(func(m map[string]any) { m["alg"] = "ES256" }), wantErr: "alg"},
		{name: "kid not pin", in: variant(func(m map[string]any) { m["kid"] = "key-1" }), wantErr: "kid"},
		{name: "empty", in: nil, wantErr: "malformed"},
		{name: "garbage", in: []byte("{not json"), wantErr: "malformed"},
		{name: "empty object", in: []byte("{}"), wantErr: "malformed"},
		{name: "too large", in: make([]byte, 9<<10), wantErr: "exceeds limit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePublicJWK(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), secretD) {
					t.Fatal("error contains private key material")
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePublicJWK: %v", err)
			}
			if !got.IsPublic() || !pub.Key.(*ecdsa.PublicKey).Equal(got.Key) {
				t.Fatal("parsed key differs")
			}
		})
	}
}

func TestSealOpenToken(t *testing.T) {
	k := mustJWK(t)
	pub := PublicJWK(k)
	other := mustJWK(t)
	in := SealedToken{Token: testToken, CSRSHA256: "ab12", IssuedAt: 1700000000}
	sealed, err := SealToken(&pub, in)
	if err != nil {
		t.Fatalf("SealToken: %v", err)
	}
	if strings.Count(sealed, ".") != 4 {
		t.Fatalf("not a compact JWE: %d dots", strings.Count(sealed, "."))
	}
	if strings.Contains(sealed, testToken) {
		t.Fatal("sealed form contains the token")
	}
	ep := k.Key.(*ecdsa.PrivateKey).Public().(*ecdsa.PublicKey)
	payload := func(s string) []byte { return []byte(s) }
	tampered := []byte(sealed)
	tampered[len(tampered)-30] ^= 0x01
	parts := strings.Split(sealed, ".")
	parts[3] = parts[3][:len(parts[3])-4]
	truncated := strings.Join(parts, ".")
	fullJSON := func() string {
		e, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{Algorithm: jose.ECDH_ES_A256KW, Key: ep}, nil)
		if err != nil {
			t.Fatal(err)
		}
		obj, err := e.Encrypt(payload(`{"token":"` + testToken + `"}`))
		if err != nil {
			t.Fatal(err)
		}
		return obj.FullSerialize()
	}()
	kidOther := func() string {
		e, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{Algorithm: jose.ECDH_ES_A256KW, Key: ep, KeyID: other.KeyID}, nil)
		if err != nil {
			t.Fatal(err)
		}
		obj, err := e.Encrypt(payload(`{"token":"` + testToken + `"}`))
		if err != nil {
			t.Fatal(err)
		}
		s, err := obj.CompactSerialize()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}()
	big := `{"token":"` + testToken + strings.Repeat("x", 8<<10) + `"}`

	tests := []struct {
		name    string
		key     *jose.JSONWebKey
		in      string
		want    SealedToken
		wantErr string
	}{
		{name: "round trip", key: k, in: sealed, want: in},
		{name: "minimal payload", key: k, in: rawJWE(t, ep, jose.ECDH_ES_A256KW, jose.A256GCM, payload(`{"token":"`+testToken+`"}`), nil), want: SealedToken{Token: testToken}},
		{name: "wrong key", key: other, in: sealed, wantErr: "kid mismatch"},
		{name: "wrong key without kid", key: &jose.JSONWebKey{Key: other.Key}, in: sealed, wantErr: "decrypt"},
		{name: "public key", key: &pub, in: sealed, wantErr: "not an ECDSA P-256 private key"},
		{name: "nil key", key: nil, in: sealed, wantErr: "no decryption key"},
		{name: "p384 key", key: &jose.JSONWebKey{Key: mustP384(t)}, in: sealed, wantErr: "P-384"},
		{name: "tampered", key: k, in: string(tampered), wantErr: "open token"},
		{name: "truncated ciphertext", key: k, in: truncated, wantErr: "open token"},
		{name: "empty", key: k, in: "", wantErr: "empty JWE"},
		{name: "garbage", key: k, in: "a.b.c", wantErr: "parse JWE"},
		{name: "json serialization", key: k, in: fullJSON, wantErr: "parse JWE"},
		{name: "too long", key: k, in: strings.Repeat("a", 17<<10), wantErr: "limit"},
		{name: "ecdh-es direct", key: k, in: rawJWE(t, ep, jose.ECDH_ES, jose.A256GCM, payload(`{"token":"`+testToken+`"}`), nil), wantErr: "key algorithm"},
		{name: "a128gcm", key: k, in: rawJWE(t, ep, jose.ECDH_ES_A256KW, jose.A128GCM, payload(`{"token":"`+testToken+`"}`), nil), wantErr: "content encryption"},
		{name: "a256cbc-hs512", key: k, in: rawJWE(t, ep, jose.ECDH_ES_A256KW, jose.A256CBC_HS512, payload(`{"token":"`+testToken+`"}`), nil), wantErr: "content encryption"},
		{name: "compressed", key: k, in: rawJWE(t, ep, jose.ECDH_ES_A256KW, jose.A256GCM, payload(`{"token":"`+testToken+`"}`), &jose.EncrypterOptions{Compression: jose.DEFLATE}), wantErr: "compressed"},
		{name: "kid of other key", key: k, in: kidOther, wantErr: "kid mismatch"},
		{name: "unknown field", key: k, in: rawJWE(t, ep, jose.ECDH_ES_A256KW, jose.A256GCM, payload(`{"token":"`+testToken+`","extra":"`+testToken+`"}`), nil), wantErr: "not a valid sealed token"},
		{name: "wrong type", key: k, in: rawJWE(t, ep, jose.ECDH_ES_A256KW, jose.A256GCM, payload(`{"token":"`+testToken+`","iat":"`+testToken+`"}`), nil), wantErr: `"iat" has the wrong JSON type`},
		{name: "syntax error", key: k, in: rawJWE(t, ep, jose.ECDH_ES_A256KW, jose.A256GCM, payload(`{"token":"`+testToken+`"`), nil), wantErr: "not a valid sealed token"},
		{name: "bad char", key: k, in: rawJWE(t, ep, jose.ECDH_ES_A256KW, jose.A256GCM, payload(`{"token":`+testToken+`}`), nil), wantErr: "not a valid sealed token"},
		{name: "trailing data", key: k, in: rawJWE(t, ep, jose.ECDH_ES_A256KW, jose.A256GCM, payload(`{"token":"`+testToken+`"} {"token":"`+testToken+`"}`), nil), wantErr: "trailing data"},
		{name: "not an object", key: k, in: rawJWE(t, ep, jose.ECDH_ES_A256KW, jose.A256GCM, payload(`"`+testToken+`"`), nil), wantErr: "wrong JSON type"},
		{name: "null", key: k, in: rawJWE(t, ep, jose.ECDH_ES_A256KW, jose.A256GCM, payload(`null`), nil), wantErr: "empty token"},
		{name: "empty token", key: k, in: rawJWE(t, ep, jose.ECDH_ES_A256KW, jose.A256GCM, payload(`{"token":""}`), nil), wantErr: "empty token"},
		{name: "oversize payload", key: k, in: rawJWE(t, ep, jose.ECDH_ES_A256KW, jose.A256GCM, payload(big), nil), wantErr: "limit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := OpenToken(tc.key, tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), testToken) || strings.Contains(err.Error(), "SECRET") {
					t.Fatalf("error contains the token: %v", err)
				}
				if got != (SealedToken{}) {
					t.Fatal("token returned with error")
				}
				return
			}
			if err != nil {
				t.Fatalf("OpenToken: %v", err)
			}
			if got != tc.want {
				t.Fatalf("OpenToken = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestSealTokenErrors(t *testing.T) {
	k := mustJWK(t)
	pub := PublicJWK(k)
	tests := []struct {
		name    string
		key     *jose.JSONWebKey
		tok     SealedToken
		wantErr string
	}{
		{name: "private key accepted as recipient", key: k, tok: SealedToken{Token: testToken}},
		{name: "nil key", key: nil, tok: SealedToken{Token: testToken}, wantErr: "no recipient key"},
		{name: "empty key", key: &jose.JSONWebKey{}, tok: SealedToken{Token: testToken}, wantErr: "no recipient key"},
		{name: "p384", key: &jose.JSONWebKey{Key: mustP384(t).Public()}, tok: SealedToken{Token: testToken}, wantErr: "P-384"},
		{name: "symmetric", key: &jose.JSONWebKey{Key: []byte("0123456789abcdef0123456789abcdef")}, tok: SealedToken{Token: testToken}, wantErr: "want ECDSA P-256"},
		{name: "empty token", key: &pub, tok: SealedToken{}, wantErr: "token is empty"},
		{name: "oversize", key: &pub, tok: SealedToken{Token: testToken + strings.Repeat("x", 8<<10)}, wantErr: "limit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := SealToken(tc.key, tc.tok)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), testToken) {
					t.Fatalf("error contains the token: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("SealToken: %v", err)
			}
			got, err := OpenToken(k, s)
			if err != nil || got != tc.tok {
				t.Fatalf("OpenToken = %+v, %v", got, err)
			}
		})
	}
}
