//go:build !fakehw

package main

import (
	"net/http"
	"os"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/machine/access"
	"github.com/better-compute/bcd/components/machine/devices"
	"github.com/better-compute/bcd/components/machine/nodekinds"
)

// hardware is this machine.
func hardware(dataDir string) (nodekinds.Hardware, string) {
	return nodekinds.Host{DataDir: dataDir}, "host"
}

// uploadClient is nil: uploads trust the system roots.
func uploadClient() *http.Client { return nil }

func extraKinds(string) []dispatch.Kind { return nil }

// holdFiles is where GPU hold files go: through bcd helper when bcd node
// runs unprivileged, directly as root, and nowhere (every hold fails as
// node-unprivileged) when it is neither.
func holdFiles(_ string, helper *helperclient.Client) devices.Files {
	switch {
	case helper != nil:
		return devices.DirFiles{Root: "/", Helper: helper}
	case os.Geteuid() == 0:
		return devices.DirFiles{Root: "/"}
	}
	return nil
}

// accessConfig: sshd's files through bcd helper when bcd node runs
// unprivileged, directly as root, and not at all (a section with SSH fails
// as node-unprivileged) when it is neither.
func accessConfig(_ string, helper *helperclient.Client, systemAccounts []string) access.Config {
	return access.Config{Root: "/", Helper: helper, Direct: helper == nil && os.Geteuid() == 0, SystemAccounts: systemAccounts}
}

// extraSections: a host build converges no test section.
func extraSections(string) []converge.Section { return nil }

func fakeCommands() []cli.Command { return nil }
