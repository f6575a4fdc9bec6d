package ek

import (
	"testing"

	"github.com/better-compute/bcd/components/trust/tpm"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
)

// testTPM is a TPM with its endorsement key, as the tests use both.
type testTPM struct {
	*tpm.TPM
	e *Endorsement
}

func (x testTPM) EK() (*EK, error) { return x.e.EK() }

func (x testTPM) ActivateCredential(ak *tpm.Key, credBlob, encSecret []byte) ([]byte, error) {
	return x.e.ActivateCredential(ak, credBlob, encSecret)
}

// swtpm is a software TPM the test started (components/trust/tpm/swtpmtest).
type swtpm struct {
	*swtpmtest.SWTPM
}

func startSWTPM(t testing.TB, dir string) *swtpm {
	t.Helper()
	return &swtpm{SWTPM: swtpmtest.Start(t, dir)}
}

// open connects to the swtpm and closes the connection when the test ends.
func (s *swtpm) open(t testing.TB) testTPM {
	t.Helper()
	tp, err := tpm.OpenTCP(s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Close() })
	return testTPM{TPM: tp, e: New(tp)}
}

// openSWTPM starts a fresh swtpm and connects to it.
func openSWTPM(t testing.TB) testTPM {
	t.Helper()
	return startSWTPM(t, "").open(t)
}

// setupEKCerts makes a TPM state with EK certificates (swtpm_setup) and
// returns its directory.
func setupEKCerts(t testing.TB) string {
	t.Helper()
	state, _ := swtpmtest.SetupEKCerts(t)
	return state
}

// unique is a node key's unique filled with b.
func unique(b byte) [tpm.UniqueSize]byte {
	var u [tpm.UniqueSize]byte
	for i := range u {
		u[i] = b + byte(i)
	}
	return u
}

func nodeKey(t *testing.T, tp testTPM, u [tpm.UniqueSize]byte) *tpm.Key {
	t.Helper()
	k, err := tp.NodeKey(u)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
