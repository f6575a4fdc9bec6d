package doctor

import (
	"context"
	"errors"
	"os"

	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/trust/identity"
)

// tpmDevice is the kernel's TPM resource manager.
const tpmDevice = "/dev/tpmrm0"

// fakeSWTPMEnv names, in fakehw builds, the swtpm that stands for the
// host's TPM (agentcmd.FakeSWTPMEnv).
const fakeSWTPMEnv = "BCD_FAKEHW_SWTPM"

// HostHasTPM reports whether this host has a TPM (/dev/tpmrm0; in a fakehw
// build, a swtpm named by BCD_FAKEHW_SWTPM).
func HostHasTPM() bool {
	if buildinfo.FakeHW {
		return os.Getenv(fakeSWTPMEnv) != ""
	}
	_, err := os.Stat(tpmDevice)
	return err == nil
}

// Warning for a file key on a host with a TPM (docs/tpm.md).
const fileKeyWithTPM = "a file key although this host has a TPM: the next renewal moves it into the TPM (through bcd helper when bcd node runs unprivileged)"

// NodeKey says what holds the node key once the node has joined: ok in the
// TPM, ok for a file key on a host without a TPM, and a warning for a file
// key on a host with one (moved at the next renewal, through bcd helper's
// tpm.* operations when bcd node runs beside it).
func NodeKey(dataDir string, hasTPM bool) Check {
	return Check{Name: "node key", Run: func(context.Context) Result {
		r := Result{Name: "node key"}
		a, err := identity.Load(dataDir)
		switch {
		case errors.Is(err, identity.ErrNotJoined):
			r.Status, r.Detail = OK, "none yet: this node has not joined"
			return r
		case err != nil:
			r.Status, r.Detail = Warn, "unknown: the identity does not load (see the identity check)"
			return r
		}
		switch {
		case a.KeyHolder == identity.KeyInTPM:
			r.Status, r.Detail = OK, "in the TPM"
		case !hasTPM:
			r.Status, r.Detail = OK, "a file (this host has no TPM)"
		default:
			r.Status, r.Detail = Warn, fileKeyWithTPM
		}
		return r
	}}
}
