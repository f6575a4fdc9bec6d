// Command bcd-site is the site role: the agent beside a site's machines
// (boot server, image cache, BMCs). Its components are wired here.
package main

import (
	"github.com/better-compute/bcd/components/agentcmd"
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/config"
	"github.com/better-compute/bcd/components/doctor"
	"github.com/better-compute/bcd/components/roles"
	"github.com/better-compute/bcd/components/status"
)

func main() {
	roles.Main("site", []cli.Command{
		agentcmd.Agent("site", "site", "run the site agent", nil),
		agentcmd.Join(),
		status.Command(),
		doctor.Command(func(cfg *config.Config, path string) []doctor.Check { return doctor.Base(cfg, path) }),
	}, nil)
}
