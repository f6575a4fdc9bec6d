//go:build fakehw

package main

import (
	"os"
	"strconv"

	"github.com/better-compute/bcd/components/agentcmd"
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/config"
	"github.com/better-compute/bcd/components/dispatch"
	"github.com/better-compute/bcd/components/fakehw"
	"github.com/better-compute/bcd/components/fakekinds"
	"github.com/better-compute/bcd/components/nodekinds"
)

// machineKinds runs the node kinds on the fake machine of BCD_FAKEHW_SEED
// (default 1), plus the test kinds.
func machineKinds(cfg *config.Config) []dispatch.Kind {
	seed := int64(1)
	if v := os.Getenv("BCD_FAKEHW_SEED"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			seed = n
		}
	}
	return fakeMachine(cfg.DataDir, seed)
}

func fakeMachine(dataDir string, seed int64) []dispatch.Kind {
	return append(nodekinds.Kinds(fakehw.Hardware{Seed: seed, DataDir: dataDir}, nil), fakekinds.Kinds(dataDir)...)
}

// fakeCommands are the commands only a fakehw build has.
func fakeCommands() []cli.Command { return []cli.Command{agentcmd.Sim(fakeMachine)} }
