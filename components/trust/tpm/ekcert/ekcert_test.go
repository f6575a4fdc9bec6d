package ekcert

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/tpm/nodetpm"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
)

// readEK starts a swtpm on state ("" for a fresh one) and reads its EK.
func readEK(t *testing.T, state string) (pub, cert []byte) {
	t.Helper()
	sw := swtpmtest.Start(t, state)
	tp, err := nodetpm.OpenTCP(sw.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	pub, cert, err = tp.EK()
	if err != nil {
		t.Fatal(err)
	}
	return pub, cert
}

func TestVerify(t *testing.T) {
	state, _ := swtpmtest.SetupEKCerts(t)
	caPEM, err := os.ReadFile(filepath.Join(filepath.Dir(state), "ca", "issuercert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("swtpm's local CA certificate does not parse")
	}
	ekPub, ekCert := readEK(t, state)
	if ekCert == nil {
		t.Fatal("swtpm_setup's TPM has no EK certificate")
	}
	if err := Verify(ekCert, ekPub, roots, nil); err != nil {
		t.Fatalf("the swtpm EK certificate under its CA: %v", err)
	}
	other, _ := pki.NewCA("another EK CA", time.Hour)
	otherRoots := x509.NewCertPool()
	otherRoots.AddCert(other.Cert)
	if err := Verify(ekCert, ekPub, otherRoots, nil); err == nil {
		t.Error("the EK certificate verified under another CA")
	}
	// The certificate of this EK presented with another TPM's EK.
	ek2Pub, _ := readEK(t, "")
	if err := Verify(ekCert, ek2Pub, roots, nil); err == nil || !strings.Contains(err.Error(), "another key") {
		t.Errorf("a certificate for another EK: %v", err)
	}
	if err := Verify([]byte("not a certificate"), ekPub, roots, nil); err == nil {
		t.Error("garbage verified as an EK certificate")
	}
}
