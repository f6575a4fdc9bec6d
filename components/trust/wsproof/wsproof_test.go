package wsproof

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/pki"
)

func key(t *testing.T) (*ecdsa.PrivateKey, []byte, string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	spki, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
	pin, _ := pki.Pin(&k.PublicKey)
	return k, spki, pin
}

func selfCert(t *testing.T, k *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "n"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c
}

// TestGatewayProof: the agent takes a challenge only when the pinned
// join-signing key signed it over the agent's own nonce.
func TestGatewayProof(t *testing.T) {
	gk, gspki, gpin := key(t)
	_, ospki, opin := key(t)
	iss := NewIssuer(gk, gspki, []byte("mac"), nil)
	nonce := NewNonce()
	c, err := iss.Issue(nonce)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyGateway(c, nonce, gpin); err != nil {
		t.Fatalf("a good proof: %v", err)
	}
	forged := c
	forged.SigningKey = ospki
	for _, tc := range []struct {
		name  string
		c     Challenge
		nonce []byte
		pin   string
		want  string
	}{
		{"another pin", c, nonce, opin, "not the pinned"},
		{"another key named", forged, nonce, gpin, "not the pinned"},
		{"another nonce (a replayed challenge)", c, NewNonce(), gpin, "does not verify"},
		{"a changed challenge", Challenge{Challenge: append([]byte{1}, c.Challenge[1:]...), SigningKey: c.SigningKey, Signature: c.Signature}, nonce, gpin, "does not verify"},
		{"a short challenge", Challenge{Challenge: c.Challenge[:10], SigningKey: c.SigningKey, Signature: c.Signature}, nonce, gpin, "malformed"},
	} {
		if err := VerifyGateway(tc.c, tc.nonce, tc.pin); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestChallengeSpentOnce: a challenge is answered once, within its
// lifetime, and only at a gateway with the same MAC key.
func TestChallengeSpentOnce(t *testing.T) {
	gk, gspki, _ := key(t)
	now := time.Now()
	iss := NewIssuer(gk, gspki, []byte("mac"), func() time.Time { return now })
	c, _ := iss.Issue(NewNonce())
	other := NewIssuer(gk, gspki, []byte("other"), func() time.Time { return now })
	if err := other.Spend(c.Challenge); err == nil || !strings.Contains(err.Error(), "not one this gateway issued") {
		t.Fatalf("another MAC key: %v", err)
	}
	if err := iss.Spend(c.Challenge); err != nil {
		t.Fatal(err)
	}
	if err := iss.Spend(c.Challenge); err == nil || !strings.Contains(err.Error(), "answered before") {
		t.Fatalf("spent twice: %v", err)
	}
	c2, _ := iss.Issue(NewNonce())
	now = now.Add(Lifetime + time.Second)
	if err := iss.Spend(c2.Challenge); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired: %v", err)
	}
	if _, err := iss.Issue([]byte("short")); err == nil {
		t.Fatal("a short nonce was taken")
	}
}

// TestNodeProof: the node's proof verifies only under its certificate's
// key, for its purpose, challenge, nonce and body.
func TestNodeProof(t *testing.T) {
	gk, gspki, _ := key(t)
	nk, _, _ := key(t)
	ok, _, _ := key(t)
	cert, other := selfCert(t, nk), selfCert(t, ok)
	c, _ := NewIssuer(gk, gspki, []byte("mac"), nil).Issue(NewNonce())
	nonce := NewNonce()
	p, err := SignNode(nk, cert.Raw, PurposeRenew, c, nonce, []byte("request"))
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyNode(cert, p, PurposeRenew, c, nonce, []byte("request")); err != nil {
		t.Fatalf("a good proof: %v", err)
	}
	for _, tc := range []struct {
		name    string
		cert    *x509.Certificate
		purpose string
		nonce   []byte
		body    string
	}{
		{"another certificate", other, PurposeRenew, nonce, "request"},
		{"a session proof", cert, PurposeSession, nonce, "request"},
		{"another nonce", cert, PurposeRenew, NewNonce(), "request"},
		{"another request", cert, PurposeRenew, nonce, "changed"},
	} {
		if err := VerifyNode(tc.cert, p, tc.purpose, c, tc.nonce, []byte(tc.body)); err == nil {
			t.Errorf("%s: verified", tc.name)
		}
	}
}

func TestWire(t *testing.T) {
	for _, code := range []uint32{1, 7, 8, 16} {
		if got, ok := CodeOfClose(CloseCode(code)); !ok || got != code {
			t.Errorf("code %d: %d %v", code, got, ok)
		}
	}
	if _, ok := CodeOfClose(1000); ok {
		t.Error("a normal closure carried a code")
	}
	if ms, msg := ParsePushback(PushbackReason(2000, "busy")); ms != "2000" || msg != "busy" {
		t.Errorf("pushback: %q %q", ms, msg)
	}
	if ms, msg := ParsePushback("pushback_ms=x busy"); ms != "" || msg != "pushback_ms=x busy" {
		t.Errorf("a malformed pushback: %q %q", ms, msg)
	}
	if len(TrimReason(strings.Repeat("x", 500))) > 123 {
		t.Error("reason not trimmed")
	}
}

// FuzzDecode: what a proxy or peer sends never panics the decoders.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"challenge":"AAAA","signing_key":"AAAA","signature":"AAAA"}`))
	f.Add([]byte(`{"certificate":"AAAA","signature":"AAAA"}`))
	f.Add([]byte(`{"nonce":"AAAA","challenge":"AAAA","proof":{},"request":"AAAA"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var c Challenge
		if Decode(b, &c) == nil {
			_ = VerifyGateway(c, make([]byte, NonceSize), "sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=")
		}
		var p Proof
		_ = Decode(b, &p)
		var rb RenewBody
		_ = DecodeRenew(b, &rb)
		_, _ = ParsePushback(string(b))
	})
}
