package join

import (
	"crypto/x509"
	"testing"

	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// FuzzVerifyResponse feeds arbitrary JoinResponse bytes (from the network)
// through the verifier: it must never panic, and nothing unsigned passes.
func FuzzVerifyResponse(f *testing.F) {
	signer, err := pki.GenerateKey()
	if err != nil {
		f.Fatal(err)
	}
	spki, _ := x509.MarshalPKIXPublicKey(signer.Public())
	pin, _ := pki.Pin(signer.Public())
	nodeKey, _ := pki.GenerateKey()
	csr, _ := pki.CreateCSR(nodeKey, "n")
	good := []byte{0x0a, 0x03, 'a', 'b', 'c'}
	sig, _ := pki.Sign(signer, pki.PurposeJoinResponse, good)
	f.Add(good, sig, spki)
	f.Add([]byte{}, []byte{}, []byte{})
	f.Fuzz(func(t *testing.T, result, sig, key []byte) {
		r := &bcdv1.JoinResponse{Result: result, Signature: sig, SigningKey: key}
		res, _, err := VerifyResponse(r, pin, csr, nodeKey.Public(), "node")
		if err == nil && res == nil {
			t.Fatal("no error and no result")
		}
		if err == nil {
			// Only a response signed by the pinned key may verify.
			if pki.Verify(signer.Public(), pki.PurposeJoinResponse, result, sig) != nil {
				t.Fatal("an unsigned response verified")
			}
		}
	})
}
