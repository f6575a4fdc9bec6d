// Command bcd-site is the site role: the agent beside a site's machines
// (boot server, image cache, BMCs). Its components are wired here.
package main

import (
	"time"

	"github.com/better-compute/bcd/components/agentcmd"
	"github.com/better-compute/bcd/components/bootlease"
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/config"
	"github.com/better-compute/bcd/components/doctor"
	"github.com/better-compute/bcd/components/roles"
	"github.com/better-compute/bcd/components/status"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// machine wires the site's boot lease (the boot server asks it before it
// answers any machine).
func machine(*config.Config) agentcmd.Machine {
	lease := &bootlease.Lease{}
	return agentcmd.Machine{
		OnDesiredState: func(ds *bcdv1.DesiredState, serverNow time.Time) { _ = lease.Apply(ds.GetSpec(), serverNow) },
		BootLease:      func() (bool, time.Duration) { return lease.Active(), lease.Left() },
	}
}

func main() {
	roles.Main("site", []cli.Command{
		agentcmd.Agent("site", "site", "run the site agent", machine),
		agentcmd.Join(),
		status.Command(),
		doctor.Command(func(cfg *config.Config, path string) []doctor.Check { return doctor.Base(cfg, path) }),
	}, nil)
}
