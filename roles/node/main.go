// Command bcd-node is the node role: the agent on every server of the
// fleet. Its components are wired here, explicitly; the machine it runs
// on is the real one (machine_host.go) or, in a fakehw build, a fake one
// (machine_fakehw.go).
package main

import (
	"log/slog"

	"github.com/better-compute/bcd/components/agent/agentcmd"
	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/base/roles"
	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/machine/dcgm"
	"github.com/better-compute/bcd/components/machine/doctor"
	"github.com/better-compute/bcd/components/machine/nodekinds"
)

// machine wires the node kinds and the status GPU lines for this machine.
func machine(cfg *config.Config, _ *slog.Logger) (agentcmd.Machine, error) {
	hw, _ := hardware(cfg.DataDir)
	if cfg.Helper.Socket != "" {
		// Unprivileged: run as [helper] user, privileged work through bcd helper.
		if err := helperclient.CheckNodeUser(cfg.Helper.User); err != nil {
			return agentcmd.Machine{}, err
		}
		hw = nodekinds.WithHelper(hw, &helperclient.Client{Socket: cfg.Helper.Socket})
	}
	return agentcmd.Machine{
		Kinds: append(append(nodekinds.Kinds(hw, nil), nodekinds.LogsCollect(cfg.Path, cfg.DataDir, uploadClient()), dcgm.Kind("")),
			extraKinds(cfg.DataDir)...),
		StatusGPUs: nodekinds.StatusGPUs(hw),
		Sections:   extraSections(cfg.DataDir),
	}, nil
}

func doctorChecks(cfg *config.Config, path string) []doctor.Check {
	dataDir := config.DefaultDataDir
	var helper []doctor.Check
	if cfg != nil {
		dataDir = cfg.DataDir
		helper = append(doctor.Helper(cfg.Helper), doctor.TSS(cfg.Helper)...)
	}
	hw, backend := hardware(dataDir)
	return append(append(doctor.Base(cfg, path), nodekinds.DoctorChecks(hw, backend)...), helper...)
}

func main() {
	roles.Main("node", append([]cli.Command{
		agentcmd.Agent("node", "node", "run the node agent", machine),
		agentcmd.Join(),
		status.Command(),
		doctor.Command(doctorChecks),
		nodekinds.HardwareCommand(hardware),
	}, fakeCommands()...), nil)
}
