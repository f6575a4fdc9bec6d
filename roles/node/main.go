// Command bcd-node is the node role: the agent on every server of the
// fleet. Its components are wired here, explicitly.
package main

import (
	"github.com/better-compute/bcd/components/agentcmd"
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/roles"
)

func main() {
	roles.Main("node", []cli.Command{
		agentcmd.Agent("node", "node", "run the node agent", nil),
		agentcmd.Join(),
	}, nil)
}
