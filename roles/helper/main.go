// Command bcd-helper is the root half of privilege separation: `bcd
// helper` serves an unprivileged bcd node's typed privileged operations on
// [helper] socket (components/helper). It links no network, gRPC, connect
// or protobuf code: it parses only its own small JSON. It composes the
// host section's units (components/host/unit) for host.unit and the
// instances' root half (components/vm/rootvirt) for libvirt.*.
package main

import (
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/roles"
	"github.com/better-compute/bcd/components/helper"
	"github.com/better-compute/bcd/components/vm/rootvirt"
)

func main() {
	roles.Main("helper", append([]cli.Command{helper.Command(fakeMachine(), hostUnits(), rootvirt.Ops{}), helper.RollbackCommand()}, e2eCommands()...), nil)
}
