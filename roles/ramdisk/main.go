// Command bcd-ramdisk is the ramdisk role, started by the init of the PXE
// initramfs: it joins with the discovery attestor from the bc.* boot
// parameters and runs the ramdisk agent with disk.wipe, deploy.image,
// boot.kexec and diag.dcgm.
package main

import (
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/dcgm"
	"github.com/better-compute/bcd/components/dispatch"
	"github.com/better-compute/bcd/components/ramdiskcmd"
	"github.com/better-compute/bcd/components/ramdiskkinds"
	"github.com/better-compute/bcd/components/roles"
	"github.com/better-compute/bcd/components/status"
)

func main() {
	roles.Main("ramdisk", []cli.Command{
		ramdiskcmd.Command(func(e ramdiskcmd.Env) []dispatch.Kind {
			return append(ramdiskkinds.Kinds(ramdiskkinds.Config{CacheURL: e.CacheURL, Log: e.Log.With("component", "ramdiskkinds"),
				OS: ramdiskkinds.OSFiles{ConfigTOML: e.OSConfig, JWK: e.OSJWK}}), dcgm.Kind(""))
		}),
		status.Command(),
	}, nil)
}
