// Command bcd-ramdisk is the ramdisk role, started by the init of the PXE
// initramfs. The ramdisk agent itself (discovery join, wipes, deploy,
// kexec) is wired in here as it lands; until then this build has only the
// version command and says so for the rest.
package main

import (
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/roles"
)

func main() {
	roles.Main("ramdisk", []cli.Command{}, map[string]string{
		"ramdisk": "bcd ramdisk: the ramdisk agent has not landed in this build yet",
	})
}
