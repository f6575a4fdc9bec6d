// Command bcd-helper is the root half of privilege separation. It links no
// network, gRPC, connect or protobuf code: it parses only its own small
// JSON. Its operations are wired here as they land.
package main

import (
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/roles"
)

func main() {
	roles.Main("helper", []cli.Command{}, map[string]string{
		"helper": "bcd helper: privilege separation has not landed in this build yet",
	})
}
