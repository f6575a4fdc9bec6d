//go:build !fakehw

package main

import (
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/dispatch"
	"github.com/better-compute/bcd/components/nodekinds"
)

// hardware is this machine.
func hardware(string) (nodekinds.Hardware, string) { return nodekinds.Host{}, "host" }

func extraKinds(string) []dispatch.Kind { return nil }

func fakeCommands() []cli.Command { return nil }
