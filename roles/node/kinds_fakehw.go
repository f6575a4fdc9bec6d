//go:build fakehw

package main

import (
	"github.com/better-compute/bcd/components/agentcmd"
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/config"
	"github.com/better-compute/bcd/components/dispatch"
	"github.com/better-compute/bcd/components/fakekinds"
)

func fakeKinds(cfg *config.Config) []dispatch.Kind { return fakekinds.Kinds(cfg.DataDir) }

// fakeCommands are the commands only a fakehw build has.
func fakeCommands() []cli.Command { return []cli.Command{agentcmd.Sim(fakekinds.Kinds)} }
