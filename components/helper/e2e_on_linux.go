//go:build helpere2e

package helper

import (
	"context"
	"github.com/better-compute/bcd/components/helper/cdispec"
	"os"

	"github.com/better-compute/bcd/components/trust/tpm"
)

// Environment variables a helpere2e build (the root end-to-end test's,
// never a release build) reads, so that test can follow slice.apply and
// slice.remove through the real binary on a host systemd does not run,
// the tpm.* operations against a swtpm, and CDI specs on a host without
// an NVIDIA GPU.
const (
	// e2eSystemctlEnv names a program run in place of systemctl.
	e2eSystemctlEnv = "BCD_HELPER_E2E_SYSTEMCTL"
	// e2eUnitRootEnv names the directory /run/systemd/system is looked
	// for under, in place of /.
	e2eUnitRootEnv = "BCD_HELPER_E2E_UNIT_ROOT"
	// e2eCgroupEnv names the directory read in place of /sys/fs/cgroup.
	e2eCgroupEnv = "BCD_HELPER_E2E_CGROUP"
	// e2eSWTPMEnv names a swtpm's TCP command port (host:port) opened in
	// place of /dev/tpmrm0 for the tpm.* operations.
	e2eSWTPMEnv = "BCD_HELPER_E2E_SWTPM"
	// e2eProcEnv names the directory read in place of /proc for the
	// NVIDIA GPUs' device minors (driver/nvidia/gpus/*/information).
	e2eProcEnv = "BCD_HELPER_E2E_PROC"
)

// e2eSeams applies the helpere2e environment variables that are set.
func e2eSeams(s *seams) {
	if p := os.Getenv(e2eSystemctlEnv); p != "" {
		s.systemctl = func(ctx context.Context, args ...string) ([]byte, error) {
			return runPath(ctx, p, "systemctl", args...)
		}
	}
	if d := os.Getenv(e2eUnitRootEnv); d != "" {
		s.unitRoot = d
	}
	if d := os.Getenv(e2eCgroupEnv); d != "" {
		s.cgroup = d
	}
	if d := os.Getenv(e2eProcEnv); d != "" {
		s.gpuMinors = func() ([]int, error) { return hostGPUMinors(d) }
		s.migCaps = func() (cdispec.MIGCaps, error) { return hostMIGCaps(d) }
	}
	if addr := os.Getenv(e2eSWTPMEnv); addr != "" {
		s.openTPM = func() (*tpm.TPM, error) { return tpm.OpenTCP(addr) }
	}
}
