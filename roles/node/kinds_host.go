//go:build !fakehw

package main

import (
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/config"
	"github.com/better-compute/bcd/components/dispatch"
	"github.com/better-compute/bcd/components/nodekinds"
)

// machineKinds runs the node kinds on this machine.
func machineKinds(*config.Config) []dispatch.Kind { return nodekinds.Kinds(nodekinds.Host{}, nil) }

func fakeCommands() []cli.Command { return nil }
