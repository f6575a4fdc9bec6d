package nodetpm_test

import (
	"crypto"
	"crypto/ecdsa"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/tpm"
	"github.com/better-compute/bcd/components/trust/tpm/nodetpm"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
)

func open(t *testing.T) *nodetpm.TPM {
	t.Helper()
	tp, err := nodetpm.OpenTCP(swtpmtest.Start(t, "").Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Close() })
	return tp
}

func TestNodeKeysAndCertify(t *testing.T) {
	tp, other := open(t), open(t)
	k, err := tp.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	again, err := tp.NodeKey(k.(*nodetpm.Key).TPMUnique())
	if err != nil || !again.Public().(*ecdsa.PublicKey).Equal(k.Public()) {
		t.Fatalf("the same unique derived another key: %v", err)
	}
	qd := [tpm.QualifyingDataSize]byte{1, 2, 3}
	keyPub, attest, sig, err := tp.Certify(k, qd)
	if err != nil {
		t.Fatal(err)
	}
	akPub, _ := tp.AKPublic()
	if err := tpm.VerifyCertify(akPub, attest, sig, keyPub, qd); err != nil {
		t.Fatalf("the certification does not verify: %v", err)
	}
	ok, _ := other.NewNodeKey()
	file, _ := pki.GenerateKey()
	for name, key := range map[string]crypto.Signer{"another TPM's key": ok, "a file key": file} {
		if _, _, _, err := tp.Certify(key, qd); err == nil || !strings.Contains(err.Error(), "not a node key of this TPM") {
			t.Errorf("certify %s: %v", name, err)
		}
	}
}
