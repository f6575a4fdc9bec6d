// Command bcd-node is the node role: the agent on every server of the
// fleet. Its components are wired here, explicitly; the machine it runs
// on is the real one (machine_host.go) or, in a fakehw build, a fake one
// (machine_fakehw.go).
package main

import (
	"log/slog"

	"github.com/better-compute/bcd/components/agentcmd"
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/config"
	"github.com/better-compute/bcd/components/dcgm"
	"github.com/better-compute/bcd/components/doctor"
	"github.com/better-compute/bcd/components/helperclient"
	"github.com/better-compute/bcd/components/nodekinds"
	"github.com/better-compute/bcd/components/roles"
	"github.com/better-compute/bcd/components/status"
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
