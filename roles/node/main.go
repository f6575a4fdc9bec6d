// Command bcd-node is the node role: the agent on every server of the
// fleet. Its components are wired here, explicitly.
package main

import (
	"github.com/better-compute/bcd/components/agentcmd"
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/config"
	"github.com/better-compute/bcd/components/dispatch"
	"github.com/better-compute/bcd/components/roles"
)

// kinds is the node's command table (agent.ping is every agent's): the
// node kinds on this machine, or in a fakehw build on a fake machine plus
// the test kinds (kinds_fakehw.go).
func kinds(cfg *config.Config) []dispatch.Kind {
	return machineKinds(cfg)
}

func main() {
	roles.Main("node", append([]cli.Command{
		agentcmd.Agent("node", "node", "run the node agent", kinds),
		agentcmd.Join(),
	}, fakeCommands()...), nil)
}
