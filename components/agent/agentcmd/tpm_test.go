package agentcmd

import (
	"github.com/better-compute/bcd/components/base/testenv"
	"log/slog"
	"testing"

	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/helper/helpertpm"
	"github.com/better-compute/bcd/components/trust/tpm/nodetpm"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
)

// TestAgentTPM: bcd node under [helper] uses the TPM through the helper,
// never opening it; bcd site ignores [helper]; a host without a TPM and
// the ramdisk get none. The host's TPM in a fakehw build is a swtpm.
func TestAgentTPM(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	plain := &config.Config{}
	helper := &config.Config{}
	helper.Helper.Socket, helper.Helper.User = "/run/bcd-helper/helper.sock", "bcd"
	env := func(addr string) func(string) string {
		return func(k string) string {
			if k == FakeSWTPMEnv {
				return addr
			}
			return ""
		}
	}
	if !buildinfo.FakeHW {
		if HasTPM(env("")) {
			testenv.NotApplicable(t, "this host has a TPM; the fakehw build of this test covers the choice")
		}
		for _, role := range []string{"node", "site", "ramdisk"} {
			if got := agentTPM(env(""), role, helper, log); got != nil {
				t.Errorf("%s on a host without a TPM: %T", role, got)
			}
		}
		return
	}
	if got := agentTPM(env(""), "node", helper, log); got != nil {
		t.Errorf("a fakehw node without %s: %T", FakeSWTPMEnv, got)
	}
	addr := swtpmtest.Start(t, "").Addr
	if got, ok := agentTPM(env(addr), "node", helper, log).(*helpertpm.TPM); !ok {
		t.Errorf("node under [helper]: %T, want the helper's TPM", got)
	}
	if got := agentTPM(env(addr), "ramdisk", helper, log); got != nil {
		t.Errorf("ramdisk: %T", got)
	}
	for _, tt := range []struct {
		role string
		cfg  *config.Config
	}{{"node", plain}, {"site", helper}} {
		got := agentTPM(env(addr), tt.role, tt.cfg, log)
		if _, ok := got.(*nodetpm.TPM); !ok {
			t.Errorf("%s: %T, want the TPM opened itself", tt.role, got)
		}
		if got != nil {
			got.Close() // swtpm serves one connection at a time
		}
	}
}
