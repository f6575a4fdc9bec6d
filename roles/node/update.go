package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/better-compute/bcd/components/agent/agentcmd"
	"github.com/better-compute/bcd/components/agent/update"
	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/config"
)

// installer chooses the privileged half of self-update.
//
// HELPER INSTALLER GOES HERE: under [helper] the slots are root's and the
// helper's update.* operations are the Installer (helperclient); until
// they are wired in, a node under [helper] runs without self-update.
func installer(cfg *config.Config) (update.Installer, error) {
	if cfg.Helper.Socket != "" {
		return nil, update.ErrHelperNotWired
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the running binary: %w", err)
	}
	return update.NewManager(cfg, "node", exe, buildinfo.Version), nil
}

// withUpdate adds self-update to m: daemon.upgrade, the daemon section,
// the confirmation on the first Welcome and the restart into the slots'
// current binary. Without an installer the node runs without it (and
// says why).
func withUpdate(m *agentcmd.Machine, cfg *config.Config, log *slog.Logger) {
	inst, err := installer(cfg)
	if err != nil {
		log.Error("self-update is off", "component", "update", "err", err)
		return
	}
	m.Update = update.NewAgent(cfg, inst, buildinfo.Version, log)
	m.UpdateExec = update.CurrentPath(cfg)
}
