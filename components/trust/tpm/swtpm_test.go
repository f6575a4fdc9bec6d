package tpm

import (
	"testing"

	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
)

// swtpm is a software TPM the test started (components/trust/tpm/swtpmtest).
type swtpm struct {
	*swtpmtest.SWTPM
	dir, addr string
}

// startSWTPM starts swtpm on state dir ("" for a fresh one).
func startSWTPM(t testing.TB, dir string) *swtpm {
	t.Helper()
	s := swtpmtest.Start(t, dir)
	return &swtpm{SWTPM: s, dir: s.Dir, addr: s.Addr}
}

// stop ends swtpm, which writes its state.
func (s *swtpm) stop() { s.Stop() }

// open connects to the swtpm and closes the connection when the test ends.
func (s *swtpm) open(t testing.TB) *TPM {
	t.Helper()
	tp, err := OpenTCP(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Close() })
	return tp
}

// openSWTPM starts a fresh swtpm and connects to it.
func openSWTPM(t testing.TB) *TPM {
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
