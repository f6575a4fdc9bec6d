package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/better-compute/bcd/components/agent/agentcmd"
	"github.com/better-compute/bcd/components/agent/update"
	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/helper/helperclient"
)

// installer chooses the privileged half of self-update: under [helper]
// the slots are root's and the helper's update.* operations are the
// Installer; otherwise the node keeps its slots itself.
func installer(cfg *config.Config) (update.Installer, error) {
	if cfg.Helper.Socket != "" {
		return (&helperclient.Client{Socket: cfg.Helper.Socket}).Updater(), nil
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
	if cfg.Helper.Socket != "" && len(cfg.Update.ReleasePins) == 0 {
		// The helper reads the same [update]: without pins it refuses
		// every update.* operation, so the node does not ask.
		log.Info("self-update is off: no [update] release_pins", "component", "update")
		return
	}
	inst, err := installer(cfg)
	if err != nil {
		log.Error("self-update is off", "component", "update", "err", err)
		return
	}
	m.Update = update.NewAgent(cfg, inst, buildinfo.Version, log)
	m.UpdateExec = update.CurrentPath(cfg)
}
