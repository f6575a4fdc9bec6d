//go:build !fakehw

package main

import (
	"net/http"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/machine/nodekinds"
)

// hardware is this machine.
func hardware(dataDir string) (nodekinds.Hardware, string) {
	return nodekinds.Host{DataDir: dataDir}, "host"
}

// uploadClient is nil: uploads trust the system roots.
func uploadClient() *http.Client { return nil }

func extraKinds(string) []dispatch.Kind { return nil }

// extraSections: a host build converges no test section.
func extraSections(string) []converge.Section { return nil }

func fakeCommands() []cli.Command { return nil }
