//go:build !fakehw

package main

import (
	"github.com/better-compute/bcd/components/helper"
	"github.com/better-compute/bcd/components/host/unit"
)

// fakeMachine is nil in a host build: the helper reads the real machine.
func fakeMachine() *helper.FakeMachine { return nil }

// hostUnits are the host section's units host.unit runs on this host.
func hostUnits() helper.HostUnits { return unit.Root{Units: unit.Standard()} }
