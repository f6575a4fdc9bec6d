package main

import (
	"log/slog"
	"os"

	"github.com/better-compute/bcd/components/agent/agentcmd"
	"github.com/better-compute/bcd/components/agent/update"
	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/config"
)

// withUpdate adds self-update to the site agent (which runs as root and
// ignores [helper], so its slots are its own): daemon.upgrade, the
// daemon section, the confirmation on the first Welcome and the restart
// into the slots' current binary.
func withUpdate(m *agentcmd.Machine, cfg *config.Config, log *slog.Logger) {
	exe, err := os.Executable()
	if err != nil {
		log.Error("self-update is off: finding the running binary", "component", "update", "err", err)
		return
	}
	inst := update.NewManager(cfg, "site", exe, buildinfo.Version)
	m.Update = update.NewAgent(cfg, inst, buildinfo.Version, log)
	m.UpdateExec = update.CurrentPath(cfg)
}
