// Command bcd-ramdisk is the ramdisk role, started by the init of the PXE
// initramfs: it joins with the discovery attestor from the bc.* boot
// parameters and runs the ramdisk agent. Its kinds (disk.wipe,
// deploy.image, boot.kexec) are wired here as they land.
package main

import (
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/ramdiskcmd"
	"github.com/better-compute/bcd/components/roles"
	"github.com/better-compute/bcd/components/status"
)

func main() {
	roles.Main("ramdisk", []cli.Command{
		ramdiskcmd.Command(nil),
		status.Command(),
	}, nil)
}
