package agentcmd

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/better-compute/bcd/components/agent/renew"
	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/helper/helpertpm"
	"github.com/better-compute/bcd/components/trust/tpm"
	"github.com/better-compute/bcd/components/trust/tpm/nodetpm"
)

// FakeSWTPMEnv names, in fakehw builds only, the swtpm (host:port of its TCP
// command port, `swtpm socket --server type=tcp`) that stands for the host's
// TPM. A fakehw build without it has no TPM; a host build ignores it.
const FakeSWTPMEnv = "BCD_FAKEHW_SWTPM"

// ErrNoTPM is OpenTPM's answer on a host without a TPM.
var ErrNoTPM = errors.New("this host has no TPM (" + tpm.DefaultPath + " does not exist)")

// OpenTPM opens the host's TPM: /dev/tpmrm0, or in a fakehw build the swtpm
// at $BCD_FAKEHW_SWTPM. It answers ErrNoTPM when there is none.
func OpenTPM(getenv func(string) string) (*nodetpm.TPM, error) {
	if buildinfo.FakeHW {
		addr := getenv(FakeSWTPMEnv)
		if addr == "" {
			return nil, fmt.Errorf("this fakehw machine has no TPM (set %s to a swtpm's host:port)", FakeSWTPMEnv)
		}
		return nodetpm.OpenTCP(addr)
	}
	if !nodetpm.Present(tpm.DefaultPath) {
		return nil, ErrNoTPM
	}
	return nodetpm.Open(tpm.DefaultPath)
}

// HasTPM reports whether this host has a TPM, usable or not (bcd doctor's
// warning for a file key on a host with a TPM).
func HasTPM(getenv func(string) string) bool {
	if buildinfo.FakeHW {
		return getenv(FakeSWTPMEnv) != ""
	}
	return nodetpm.Present(tpm.DefaultPath)
}

// agentTPMs is what the agent uses of a TPM: renewal's and the identity's
// calls, and Close.
type agentTPMs interface {
	renew.TPM
	Close() error
}

// agentTPM opens the TPM for `bcd node` and `bcd site`: the host's TPM when
// it has one; for a node beside bcd helper, which never opens the TPM
// itself, the helper's tpm.* operations (helpertpm, every answer checked;
// bcd site ignores [helper]). It answers nil when there is none or it is
// unusable, which it logs.
func agentTPM(getenv func(string) string, role string, cfg *config.Config, log *slog.Logger) agentTPMs {
	if (role != "node" && role != "site") || !HasTPM(getenv) {
		return nil
	}
	if role == "node" && cfg.Helper.Socket != "" {
		log.Info("bcd node runs beside bcd helper: node keys in the TPM go through the helper's tpm.* operations", "socket", cfg.Helper.Socket)
		return helpertpm.New(&helperclient.Client{Socket: cfg.Helper.Socket})
	}
	t, err := OpenTPM(getenv)
	if err != nil {
		log.Warn("this host has a TPM but it cannot be opened; the node key stays where it is", "err", err)
		return nil
	}
	return t
}
