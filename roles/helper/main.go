// Command bcd-helper is the root half of privilege separation: `bcd
// helper` serves an unprivileged bcd node's typed privileged operations on
// [helper] socket (components/helper). It links no network, gRPC, connect
// or protobuf code: it parses only its own small JSON. It composes the
// host section's units (components/host/unit) for host.unit.
package main

import (
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/roles"
	"github.com/better-compute/bcd/components/helper"
	"github.com/better-compute/bcd/components/host/unit"
)

func main() {
	roles.Main("helper", append([]cli.Command{helper.Command(fakeMachine(), unit.Root{Units: unit.Standard()}), helper.RollbackCommand()}, e2eCommands()...), nil)
}
